"""Prompt templates: ``{column}`` placeholders, ``{{`` and ``}}`` for literal braces.

A template is both the question asked of every row and the list of columns
whose values are sent. Nothing outside the named columns reaches the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from semframe.core.table import MISSING, Codes, char_lengths, factorize, take_values
from semframe.errors import ColumnError, TemplateError, did_you_mean

INLINE_CHARS = 80
"""Values up to this length stand inline where a restated question names them."""

_DETERMINERS = frozenset(
    {"the", "a", "an", "this", "that", "these", "those", "each", "every"}
    | {"its", "their", "his", "her", "my", "your", "our"}
)

_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines splits on


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A ``{column}`` reference inside a template."""

    name: str


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed prompt template.

    Attributes
    ----------
    text : str
        The template as the caller wrote it.
    parts : tuple
        Literal text (``str``, braces unescaped) and :class:`Placeholder` items.
    fields : tuple of str
        The distinct column names the template uses, in order of first use.

    Examples
    --------
    >>> t = parse_template("Is {review} positive about {movie title}? {{yes}}")
    >>> t.fields
    ('review', 'movie title')
    >>> t.instruction()
    'Is [review] positive about [movie title]? {yes}'
    """

    text: str
    parts: tuple[str | Placeholder, ...]
    fields: tuple[str, ...]

    def instruction(self, *, brackets: bool = True) -> str:
        """The template as shared instruction text: placeholders become ``[name]``.

        The values themselves follow the instructions as labeled fields
        (``name: value``), so the instruction refers to them by name. With
        ``brackets=False`` the name is put in words (:func:`in_words`): a
        small model copies a bracketed placeholder into its answer, and
        decides worse with one.

        Examples
        --------
        >>> parse_template("Is {review} positive?").instruction()
        'Is [review] positive?'
        >>> parse_template("Summarize the review {review_text} of {movie}.").instruction(
        ...     brackets=False)
        'Summarize the review text of the movie.'
        """
        if brackets:
            return "".join(p if isinstance(p, str) else f"[{p.name}]" for p in self.parts)
        text = ""
        for before, name in self._pieces():
            text += before
            if name is not None:
                words = in_words(name, before)
                text = text + words if words else text.rstrip(" ")
        return text

    def restated(self, cells: Mapping[str, str], *, inline: int = INLINE_CHARS) -> str:
        """The question asked again after one row's fields: short values inline.

        A value of 1 to ``inline`` characters on one line stands where its
        placeholder is; another is named in words as the field above. Small
        models answer what they read last, and answer about a title or a name
        they read in the question rather than repeat the field's name.

        Examples
        --------
        >>> t = parse_template("Summarize the review {review_text} of {movie}.")
        >>> t.restated({"review_text": "A long review. " * 10, "movie": "Alien"})
        'Summarize the review text above of Alien.'
        """
        columns = {name: (value,) for name, value in cells.items()}
        return self.restated_rows(columns, [0], inline=inline)[0]

    def restated_rows(
        self,
        columns: Mapping[str, Sequence[str]],
        rows: Sequence[int],
        *,
        inline: int = INLINE_CHARS,
    ) -> list[str]:
        """:meth:`restated` for each of ``rows`` of ``columns`` (rendered cells, by field).

        Examples
        --------
        >>> t = parse_template("Is the movie {movie} good?")
        >>> t.restated_rows({"movie": ("Alien", "x" * 100, "")}, [2, 0, 1])
        ['Is the movie above good?', 'Is the movie Alien good?', 'Is the movie above good?']
        """
        coded = {name: factorize([columns[name][r] for r in rows]) for name in self.fields}
        return self.restated_coded(coded, len(rows), inline=inline)

    def restated_coded(
        self,
        coded: Mapping[str, tuple[Sequence[str], Codes]],
        n: int,
        *,
        inline: int = INLINE_CHARS,
    ) -> list[str]:
        """:meth:`restated` for ``n`` rows given by field as (distinct values, a code per row).

        Each distinct value is looked at once, and each distinct question
        rendered once (rows whose values are all named in words share one).

        Examples
        --------
        >>> import numpy as np
        >>> t = parse_template("Is {movie} a {genre}?")
        >>> coded = {"movie": (["Alien", "x" * 100], np.array([0, 1, 1])),
        ...          "genre": (["horror"], np.array([0, 0, 0]))}
        >>> t.restated_coded(coded, 3)
        ['Is Alien a horror?', 'Is the movie above a horror?', 'Is the movie above a horror?']
        """
        pieces = self._pieces()
        spoken: list[list[str]] = []  # per placeholder: its distinct spoken forms
        per_row: list[Codes] = []  # per placeholder: each row's code into them
        for before, name in pieces:
            if name is None:
                continue
            words = in_words(name, before)
            named = f"{words} above" if words else "above"
            values, codes = coded[name]
            # Only short values are said inline: their lengths are counted in C (or Arrow)
            # first, and only those values are read.
            lengths = char_lengths(values)
            short = np.flatnonzero((lengths > 0) & (lengths <= inline))
            if not short.size:  # every value is named in words (free text, say)
                spoken.append([named])
                per_row.append(np.zeros(len(codes), dtype=np.int8))
                continue
            forms = [named] * len(values)
            for i, v in zip(short.tolist(), take_values(values, short), strict=True):
                if v.isprintable() and v != MISSING:
                    forms[i] = v
            distinct, form_of_value = factorize(forms)
            spoken.append(distinct)
            per_row.append(form_of_value[codes])
        if not per_row:
            return [pieces[-1][0]] * n
        key, sizes = np.zeros(n, dtype=np.int64), 1
        for forms in spoken:
            sizes *= max(len(forms), 1)
        if sizes < 2**62:  # one integer per combination of spoken forms
            for forms, codes in zip(spoken, per_row, strict=True):
                key = key * len(forms) + codes
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        else:
            _, first, inverse = np.unique(
                np.stack(per_row, axis=1), axis=0, return_index=True, return_inverse=True
            )
        texts = []
        for r in first.tolist():
            text, at = "", 0
            for before, name in pieces:
                text += before
                if name is not None:
                    text += spoken[at][int(per_row[at][r])]
                    at += 1
            texts.append(text)
        return np.asarray(texts, dtype=object)[inverse.reshape(-1)].tolist()  # type: ignore[no-any-return]

    def _pieces(self) -> list[tuple[str, str | None]]:
        """The template as (literal text, the placeholder after it or ``None``) pairs."""
        pieces: list[tuple[str, str | None]] = []
        text = ""
        for part in self.parts:
            if isinstance(part, str):
                text += part
            else:
                pieces.append((text, part.name))
                text = ""
        pieces.append((text, None))
        return pieces

    def resolve(self, columns: Sequence[object]) -> Template:
        """Check every placeholder against ``columns``; return the template unchanged.

        Column names are compared as strings (``{0}`` names an integer column 0).
        A placeholder with surrounding spaces (``{ review }``) matches the
        stripped name when no column has the exact name.

        Raises
        ------
        ColumnError
            Naming the unknown column and listing the available ones.
        """
        names = [str(c) for c in columns]
        available = set(names)
        renamed: dict[str, str] = {}
        for f in self.fields:
            if f in available:
                continue
            if f.strip() in available:
                renamed[f] = f.strip()
                continue
            msg = (
                f"template names column {f!r}, which the frame does not have."
                f"{did_you_mean(f, names)} {_available(names)}."
            )
            raise ColumnError(msg)
        if not renamed:
            return self
        parts = tuple(
            Placeholder(renamed.get(p.name, p.name)) if isinstance(p, Placeholder) else p
            for p in self.parts
        )
        fields = tuple(dict.fromkeys(renamed.get(f, f) for f in self.fields))
        return Template(self.text, parts, fields)


SHOWN_COLUMNS = 50
"""At most this many column names are listed when a template names an unknown one."""


def in_words(name: str, before: str = "") -> str:
    """A field's name as the words a sentence would use, after the text ``before``.

    Underscores and dashes become spaces and the name takes ``the``, unless
    the text before (the template's own, since the previous placeholder)
    already ends with a determiner (``the``, ``each``...), or with the name's
    first word (``the review {review_text}`` reads ``the review text``).

    Examples
    --------
    >>> in_words("review_content"), in_words("movie", "Is the "), in_words("text", "Is the ")
    ('the review content', 'movie', 'text')
    >>> in_words("review_text", "Summarize the review "), in_words("movie", "the movie ")
    ('text', '')
    """
    words = re.sub(r"[_\-\s]+", " ", name).strip() or name
    previous = before.rstrip().rsplit(None, 1)[-1].casefold() if before.strip() else ""
    first, _, rest = words.partition(" ")
    if before[-1:].isspace() and previous == first.casefold():
        return rest
    if previous in _DETERMINERS and before[-1:].isspace():
        return words
    return f"the {words}"


def _available(names: Sequence[str]) -> str:
    """``Available columns: 'a', 'b'``, the first :data:`SHOWN_COLUMNS` of a wide frame.

    Examples
    --------
    >>> _available(["a", "b"])
    "Available columns: 'a', 'b'"
    >>> wide = _available([f"c{i}" for i in range(1000)])
    >>> wide.startswith("Available columns (the first 50 of 1,000): 'c0', 'c1', ")
    True
    >>> wide.endswith(", 'c48', 'c49', ...")
    True
    """
    if not names:
        return "Available columns: (the frame has no columns)"
    shown = ", ".join(repr(n) for n in names[:SHOWN_COLUMNS])
    if len(names) <= SHOWN_COLUMNS:
        return f"Available columns: {shown}"
    return f"Available columns (the first {SHOWN_COLUMNS} of {len(names):,}): {shown}, ..."


def parse_template(text: object, *, require_fields: bool = True) -> Template:
    """Parse a template string.

    Parameters
    ----------
    text : str
        The template, e.g. ``"Summarize {review} of {movie_title}."``.
    require_fields : bool
        Whether a template without any ``{column}`` is an error.

    Raises
    ------
    TemplateError
        Empty template, unbalanced or nested braces, empty ``{}``, a line break
        inside ``{...}``, or no placeholders when ``require_fields``.

    Examples
    --------
    >>> parse_template("Hello {name}").fields
    ('name',)
    >>> parse_template("Hello {name")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.TemplateError: unbalanced '{' at position 6 in template 'Hello {name': ...
    """
    if not isinstance(text, str):
        msg = f"template must be a str, got {type(text).__name__}."
        raise TemplateError(msg)
    if not text.strip():
        msg = (
            "template is empty; write the instruction with {column} placeholders, "
            "e.g. 'Summarize {review} in one sentence.'"
        )
        raise TemplateError(msg)
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    i, n = 0, len(text)
    short = text if len(text) <= 80 else text[:77] + "..."
    while i < n:
        ch = text[i]
        if ch == "{":
            if i + 1 < n and text[i + 1] == "{":
                literal.append("{")
                i += 2
                continue
            close = text.find("}", i + 1)
            nested = text.find("{", i + 1)
            if close == -1 or (nested != -1 and nested < close):
                msg = (
                    f"unbalanced '{{' at position {i} in template {short!r}: close it with "
                    "'}' or write '{{' for a literal brace."
                )
                raise TemplateError(msg)
            name = text[i + 1 : close]
            if len(name.splitlines()) > 1 or name.endswith(tuple(_BREAKS)):
                msg = (
                    f"the placeholder at position {i} in template {short!r} names {name!r}, "
                    "which has a line break; a field label must be one line: rename the "
                    "column (df.rename(columns=...)) and name it on one line."
                )
                raise TemplateError(msg)
            if not name.strip():
                msg = (
                    f"empty placeholder '{{}}' at position {i} in template {short!r}; "
                    "put a column name inside, or write '{{}}' for literal braces."
                )
                raise TemplateError(msg)
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(Placeholder(name))
            i = close + 1
            continue
        if ch == "}":
            if i + 1 < n and text[i + 1] == "}":
                literal.append("}")
                i += 2
                continue
            msg = (
                f"unbalanced '}}' at position {i} in template {short!r}: "
                "write '}}' for a literal brace."
            )
            raise TemplateError(msg)
        literal.append(ch)
        i += 1
    if literal:
        parts.append("".join(literal))
    fields = tuple(dict.fromkeys(p.name for p in parts if isinstance(p, Placeholder)))
    if require_fields and not fields:
        msg = (
            f"template {short!r} names no column; put the columns to send in braces, "
            "e.g. 'Is {review} positive?'."
        )
        raise TemplateError(msg)
    return Template(text, tuple(parts), fields)


def compile_template(text: object, columns: Sequence[object]) -> Template:
    """``parse_template(text)`` resolved against ``columns`` (what an operator needs).

    Examples
    --------
    >>> compile_template("Is {review} good?", ["review", "movie"]).fields
    ('review',)
    """
    return parse_template(text).resolve(columns)
