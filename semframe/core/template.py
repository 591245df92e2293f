"""Prompt templates: ``{column}`` placeholders, ``{{`` and ``}}`` for literal braces.

A template is both the question asked of every row and the list of columns
whose values are sent. Nothing outside the named columns reaches the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from semframe.errors import ColumnError, TemplateError, did_you_mean

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
        ``brackets=False`` the name stands bare: a small model copies a
        bracketed placeholder into its answer, and decides worse with one.

        Examples
        --------
        >>> parse_template("Is {review} positive?").instruction(brackets=False)
        'Is review positive?'
        """
        if not brackets:
            return "".join(p if isinstance(p, str) else p.name for p in self.parts)
        return "".join(p if isinstance(p, str) else f"[{p.name}]" for p in self.parts)

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
