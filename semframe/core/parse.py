"""Output specifications: what a relQuery's answers look like and how they parse."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from semframe.errors import InputError, SemframeError

if TYPE_CHECKING:
    from semframe.core.wire import TokenLogprob


class ParseError(SemframeError, ValueError):
    """An answer does not have the expected form."""


EMPTY_ANSWER = "empty answer: the model returned no text"
"""How every parser here reports an empty (or whitespace-only) answer."""


def _require_text(text: str) -> str:
    """``text`` stripped; :class:`ParseError` when nothing is left.

    An empty answer is never a value: not ``''`` for ``map``, not ``[]`` for
    ``classify(multi=True)``, not a default for anything else.
    """
    stripped = text.strip()
    if not stripped:
        raise ParseError(EMPTY_ANSWER)
    return stripped


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """How answers of a relQuery are constrained, described and parsed.

    Attributes
    ----------
    kind : str
        ``"text"``, ``"bool"``, ``"record"`` (extract), ``"label"`` or
        ``"labels"`` (classify).
    schema : mapping or None
        JSON schema sent to backends that can constrain decoding.
    instruction : str
        Output-format sentence appended to the shared instructions.
    parse : callable
        Raw answer text -> value; raises :class:`ParseError`.
    """

    kind: str
    schema: Mapping[str, Any] | None
    instruction: str
    parse: Callable[[str], Any]

    @property
    def keeps_truncated(self) -> bool:
        """Whether an answer cut at ``max_tokens`` that parses is kept (see :func:`accept`)."""
        return isinstance(self.parse, KeepTruncated)

    def with_truncated(self, policy: str) -> OutputSpec:
        """The spec with ``policy`` for answers cut at ``max_tokens``: ``"error"`` or ``"keep"``.

        Examples
        --------
        >>> TEXT.keeps_truncated, TEXT.with_truncated("keep").keeps_truncated
        (False, True)
        >>> TEXT.with_truncated("keep").with_truncated("error") == TEXT
        True
        """
        parse = self.parse
        if policy == "keep":
            keeps = isinstance(parse, KeepTruncated)
            return self if keeps else dataclasses.replace(self, parse=KeepTruncated(parse))
        if policy == "error":
            if isinstance(parse, KeepTruncated):
                return dataclasses.replace(self, parse=parse.parse)
            return self
        msg = f"truncated must be 'error' or 'keep', got {policy!r}."
        raise InputError(msg)


@dataclass(frozen=True, slots=True)
class KeepTruncated:
    """A parser that lets :func:`accept` keep answers cut at ``max_tokens``.

    It parses exactly as the parser it wraps; only its type says that a cut
    answer which parses is kept (``truncated="keep"``) rather than rejected.
    Built by :meth:`OutputSpec.with_truncated`.
    """

    parse: Callable[[str], Any]

    def __call__(self, text: str) -> Any:
        """Parse ``text`` with the wrapped parser."""
        return self.parse(text)


TRUNCATION_REASONS = frozenset({"length", "max_tokens"})
"""Finish reasons meaning the answer was cut at ``max_tokens``: ``"length"`` (OpenAI,
llama.cpp, vLLM) and ``"max_tokens"`` (Anthropic's stop reason)."""

CUT_NOTE = "cut at max_tokens"
"""How the note of a kept cut answer starts (``Outcome.error`` of a row that has a value)."""


def _cut(finish_reason: str | None, max_tokens: int | None) -> str:
    limit = f"max_tokens={max_tokens}" if max_tokens is not None else "max_tokens"
    return f"cut at {limit} (finish reason {finish_reason!r})"


def accept(
    parse: Callable[[str], Any],
    text: str,
    finish_reason: str | None,
    max_tokens: int | None = None,
) -> tuple[Any, str | None]:
    """The value of one answer, and a note when it was cut at ``max_tokens`` and kept.

    The one rule for every answer, live or batch: an empty answer is an
    error; an answer the backend says was cut at ``max_tokens`` (a finish
    reason in :data:`TRUNCATION_REASONS`) is an error too, unless ``parse``
    keeps cut answers (:class:`KeepTruncated`, ``truncated="keep"``) and it
    parses: then the value comes back with a note starting with
    :data:`CUT_NOTE`. Otherwise ``parse(text)``.

    Parameters
    ----------
    parse : callable
        The relQuery's parser (``OutputSpec.parse``).
    text : str
        The raw answer.
    finish_reason : str or None
        The backend's finish reason.
    max_tokens : int, optional
        The request's limit, for messages.

    Returns
    -------
    value : object
        The parsed answer.
    note : str or None
        ``None``, or why the value is marked (it was cut at ``max_tokens``).

    Raises
    ------
    ParseError
        Saying what was wrong with the answer and what to do about it.

    Examples
    --------
    >>> accept(TEXT.parse, " A slow film. ", "stop")
    ('A slow film.', None)
    >>> accept(TEXT.parse, "A slow fi", "length", 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: answer cut at max_tokens=4 (finish reason 'length'), ...
    >>> accept(TEXT.with_truncated("keep").parse, "A slow fi", "max_tokens", 4)
    ('A slow fi', "cut at max_tokens=4 (finish reason 'max_tokens'); kept because truncated='keep'")
    >>> accept(TEXT.parse, "  ", "stop")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: empty answer: the model returned no text (finish reason ...
    """
    cut = finish_reason in TRUNCATION_REASONS
    if not text.strip():
        if cut:
            msg = (
                f"empty answer: {_cut(finish_reason, max_tokens)} before any text; raise max_tokens"
            )
        else:
            msg = (
                f"{EMPTY_ANSWER} (finish reason {finish_reason!r}); it may have refused this "
                "row: check its input, or try another model"
            )
        raise ParseError(msg)
    if not cut:
        return parse(text), None
    try:
        value = parse(text)
    except ParseError as exc:
        msg = f"answer {_cut(finish_reason, max_tokens)} does not parse: {exc}; raise max_tokens"
        raise ParseError(msg) from None
    if isinstance(parse, KeepTruncated):
        return value, f"{_cut(finish_reason, max_tokens)}; kept because truncated='keep'"
    msg = (
        f"answer {_cut(finish_reason, max_tokens)}, so it may be incomplete: "
        f"{_shorten(text.strip())!r}; raise max_tokens (map, filter, extract, classify and "
        "agg also take truncated='keep': cut answers that parse are kept, marked True in a "
        "*_truncated column)"
    )
    raise ParseError(msg)


def _parse_text(text: str) -> str:
    return _require_text(text)


TEXT = OutputSpec("text", None, "", _parse_text)
"""Free text (``map``, ``agg``): the answer stripped; an empty answer is a :class:`ParseError`."""

BOOL_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}

_YES = {"yes", "true", "y"}
_NO = {"no", "false", "n"}
_BARE = re.compile(r"^\W*([A-Za-z]+)\W*$")


def parse_bool(text: str) -> bool:
    """Parse a yes/no answer strictly.

    Accepted: the JSON object ``{"answer": "yes"|"no"|true|false}``, a JSON
    boolean or string, or a bare ``yes`` / ``no`` / ``true`` / ``false``
    (any case, surrounding punctuation allowed). Anything else, an empty
    answer included, is an error, never a silent default.

    Examples
    --------
    >>> parse_bool('{"answer": "yes"}'), parse_bool("No."), parse_bool("true")
    (True, False, True)
    >>> parse_bool("maybe, it depends")
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: expected a yes/no answer, got 'maybe, it depends'
    """
    stripped = _require_text(text)
    value: Any = stripped
    if stripped[:1] in '{"' or stripped in {"true", "false"}:
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            value = stripped
    if isinstance(value, dict):
        value = value.get("answer", value)
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        match = _BARE.match(value)
        word = match.group(1).lower() if match else None
        if word in _YES:
            return True
        if word in _NO:
            return False
    shown = stripped if len(stripped) <= 200 else stripped[:197] + "..."
    msg = f"expected a yes/no answer, got {shown!r}"
    raise ParseError(msg)


BOOL = OutputSpec(
    "bool",
    BOOL_SCHEMA,
    'Answer with a JSON object: {"answer": "yes"} or {"answer": "no"}.',
    parse_bool,
)


# --- structured output (extract) -------------------------------------------------

KINDS = ("str", "int", "float", "bool", "list[str]", "literal")
"""Field kinds ``extract`` supports; ``literal`` is ``typing.Literal[...]``."""

_VALID_TYPES = "str, int, float, bool, list[str], Literal[...] (each optionally | None)"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One output column of ``extract``.

    Attributes
    ----------
    name : str
        Column name (and JSON key).
    kind : str
        One of :data:`KINDS`.
    choices : tuple
        The allowed values of a ``literal`` field (all of one type).
    nullable : bool
        Whether ``null`` is a valid answer (the type was ``X | None``).
    """

    name: str
    kind: str
    choices: tuple[str | int | float | bool, ...] = ()
    nullable: bool = False

    @property
    def dtype(self) -> str:
        """Column dtype name for the frame adapters."""
        if self.kind != "literal":
            return self.kind
        return {bool: "bool", int: "int", float: "float"}.get(type(self.choices[0]), "str")

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of this field's value."""
        base: dict[str, Any]
        if self.kind == "literal":
            base = {"enum": list(self.choices)}
        elif self.kind == "list[str]":
            base = {"type": "array", "items": {"type": "string"}}
        else:
            base = {"type": _JSON_TYPES[self.kind]}
        return {"anyOf": [base, {"type": "null"}]} if self.nullable else base

    def validate(self, value: Any) -> Any:
        """``value`` if it has this field's type, else :class:`ParseError`.

        No coercion beyond integral floats for ``int`` and ints for ``float``.
        A ``float`` field takes finite numbers only: ``NaN`` and ``Infinity``
        (which Python's JSON reader accepts, though JSON has neither) are
        errors, also for a nullable field, which takes ``null`` for a missing
        value. ``NaN`` would otherwise become a missing value in the frame,
        indistinguishable from ``null``, on a field that may not be null.

        Examples
        --------
        >>> FieldSpec("score", "float").validate(7)
        7.0
        >>> FieldSpec("score", "float", nullable=True).validate(float("nan"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        semframe.core.parse.ParseError: field 'score' is nan, expected a float value or null ...
        """
        if value is None:
            if self.nullable:
                return None
            msg = f"field {self.name!r} is null, expected {self._describe()}"
            raise ParseError(msg)
        kind = self.kind
        ok: bool
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "int":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
            if ok and not math.isfinite(value):
                msg = (
                    f"field {self.name!r} is {value!r}, expected {self._describe()} (a finite "
                    "number; NaN and Infinity are not numbers here)"
                )
                raise ParseError(msg)
        elif kind == "list[str]":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = any(value == c and type(value) is type(c) for c in self.choices)
        if not ok:
            msg = f"field {self.name!r} is {_shorten(repr(value))}, expected {self._describe()}"
            raise ParseError(msg)
        return value

    def _describe(self) -> str:
        article = "an" if self.kind[0] in "aeiou" else "a"
        text = (
            f"one of {list(self.choices)!r}"
            if self.kind == "literal"
            else f"{article} {self.kind} value"
        )
        return text + (" or null" if self.nullable else "")


_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


def _shorten(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def field_spec(name: str, annotation: object) -> FieldSpec:
    """The :class:`FieldSpec` of a type annotation.

    Raises
    ------
    InputError
        For a type ``extract`` cannot produce, listing the valid ones.

    Examples
    --------
    >>> from typing import Literal
    >>> field_spec("year", int | None)
    FieldSpec(name='year', kind='int', choices=(), nullable=True)
    >>> field_spec("mood", Literal["calm", "tense"]).json_schema()
    {'enum': ['calm', 'tense']}
    """
    import types
    import typing

    nullable = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            nullable, annotation = True, args[0]
            origin = typing.get_origin(annotation)
    simple = {str: "str", int: "int", float: "float", bool: "bool"}
    if isinstance(annotation, type) and annotation in simple:
        return FieldSpec(name, simple[annotation], (), nullable)
    if origin is list and typing.get_args(annotation) == (str,):
        return FieldSpec(name, "list[str]", (), nullable)
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        kinds = {type(c) for c in choices}
        if not choices or len(kinds) != 1 or not kinds <= {str, int, float, bool}:
            msg = (
                f"schema field {name!r}: Literal choices must be non-empty and all of one "
                f"type (str, int, float or bool), got {list(choices)!r}."
            )
            raise InputError(msg)
        return FieldSpec(name, "literal", tuple(choices), nullable)
    msg = f"schema field {name!r} has unsupported type {annotation!r}; valid types: {_VALID_TYPES}."
    raise InputError(msg)


def _json_object(text: str) -> Any:
    """The JSON value in ``text``: the whole text, or its first ``{...}`` span.

    Models wrap JSON in prose or code fences.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    start, stop = stripped.find("{"), stripped.rfind("}")
    if start != -1 and stop > start:
        try:
            return json.loads(stripped[start : stop + 1])
        except json.JSONDecodeError:
            pass
    msg = f"expected a JSON object, got {_shorten(stripped)!r}"
    raise ParseError(msg)


def record_spec(schema: object) -> tuple[OutputSpec, tuple[FieldSpec, ...]]:
    """The output spec of ``extract``: one JSON object with typed fields.

    Parameters
    ----------
    schema : mapping or pydantic model class
        Column name -> type (``str``, ``int``, ``float``, ``bool``,
        ``list[str]``, ``Literal[...]``, each optionally ``| None``), or a
        pydantic ``BaseModel`` subclass whose fields have those types (its
        validators and constraints are applied too).

    Returns
    -------
    spec : OutputSpec
        Parses an answer into a tuple of values, one per field, in order.
    fields : tuple of FieldSpec
        The output columns.

    Raises
    ------
    InputError
        An empty schema, a non-string key, or an unsupported type.

    Examples
    --------
    >>> spec, fields = record_spec({"year": int, "tags": list[str]})
    >>> spec.parse('{"year": 1979, "tags": ["space", "horror"]}')
    (1979, ['space', 'horror'])
    >>> spec.parse('{"year": "1979", "tags": []}')
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: field 'year' is '1979', expected an int value
    """
    model: Any = None
    if isinstance(schema, type) and hasattr(schema, "model_fields"):
        model = schema
        items = [(name, f.annotation) for name, f in schema.model_fields.items()]
    elif isinstance(schema, Mapping):
        items = list(schema.items())
    else:
        msg = (
            f"schema must be a mapping of column name to type or a pydantic model class, "
            f"got {type(schema).__name__}."
        )
        raise InputError(msg)
    if not items:
        msg = "schema names no field; give at least one, e.g. {'year': int}."
        raise InputError(msg)
    for name, _ in items:
        if not isinstance(name, str) or not name:
            msg = f"schema keys must be non-empty column names (str), got {name!r}."
            raise InputError(msg)
    fields = tuple(field_spec(name, annotation) for name, annotation in items)
    json_schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: f.json_schema() for f in fields},
        "required": [f.name for f in fields],
        "additionalProperties": False,
    }
    names = [f.name for f in fields]

    def parse(text: str) -> tuple[Any, ...]:
        obj = _json_object(_require_text(text))
        if not isinstance(obj, dict):
            msg = f"expected a JSON object with keys {names!r}, got {_shorten(text.strip())!r}"
            raise ParseError(msg)
        missing = [n for n in names if n not in obj]
        extra = [k for k in obj if k not in names]
        if missing or extra:
            msg = (
                f"expected exactly the keys {names!r}; missing {missing!r}, unexpected "
                f"{extra!r} in {_shorten(text.strip())!r}"
            )
            raise ParseError(msg)
        values = tuple(f.validate(obj[f.name]) for f in fields)
        if model is None:
            return values
        import pydantic

        try:
            instance = model.model_validate(dict(zip(names, values, strict=True)))
        except pydantic.ValidationError as exc:
            msg = f"{model.__name__} rejected {_shorten(text.strip())!r}: {exc}"
            raise ParseError(msg) from None
        return tuple(getattr(instance, n) for n in names)

    example = ", ".join(f'"{f.name}": ...' for f in fields)
    instruction = (
        "Answer with one JSON object and nothing else: {"
        + example
        + "}, where "
        + "; ".join(f"{f.name} is {f._describe()}" for f in fields)
        + "."
    )
    return OutputSpec("record", json_schema, instruction, parse), fields


# --- labels (classify) ---------------------------------------------------------


def label_spec(labels: object, *, multi: bool = False) -> OutputSpec:
    """The output spec of ``classify``: one label (or a list of labels with ``multi``).

    Accepted answers: ``{"answer": label}`` (``{"answer": [labels]}`` with
    ``multi``), a JSON string or list, or the bare label text (any case,
    surrounding quotes and punctuation ignored; with ``multi`` labels separated
    by commas). A label that is not one of ``labels`` is an error, and so is
    an empty answer.

    With ``multi``, "no label applies" is an explicit empty JSON list
    (``{"answer": []}`` or ``[]``), the form the instruction asks for, and
    parses to ``[]``. Text that names no label at all (an empty or
    whitespace-only answer, ``{"answer": ""}``, or only commas) is an error,
    not ``[]``: nothing in it says the model looked at the labels.

    Raises
    ------
    InputError
        Fewer than two labels (one is enough with ``multi``), a label that is
        not a non-empty string, or duplicates.

    Examples
    --------
    >>> spec = label_spec(["horror", "comedy", "drama"])
    >>> spec.parse('{"answer": "comedy"}'), spec.parse("Horror."), spec.parse('"drama"')
    ('comedy', 'horror', 'drama')
    >>> label_spec(["a", "b", "c"], multi=True).parse("c, a")
    ['a', 'c']
    >>> label_spec(["a", "b", "c"], multi=True).parse('{"answer": []}')
    []
    >>> label_spec(["a", "b", "c"], multi=True).parse("")
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: empty answer: the model returned no text
    >>> spec.parse("western")
    Traceback (most recent call last):
    ...
    semframe.core.parse.ParseError: expected one of ['horror', 'comedy', 'drama'], got 'western'
    """
    if isinstance(labels, str) or not isinstance(labels, list | tuple):
        msg = f"labels must be a list of strings, got {labels!r}."
        raise InputError(msg)
    bad = [x for x in labels if not isinstance(x, str) or not x.strip()]
    if bad:
        msg = f"labels must be non-empty strings; invalid: {bad!r}."
        raise InputError(msg)
    names: list[str] = [str(x) for x in labels]
    if len(names) < (1 if multi else 2):
        msg = f"classify needs at least {1 if multi else 2} label(s), got {names!r}."
        raise InputError(msg)
    folded = [x.strip().casefold() for x in names]
    if len(set(folded)) != len(folded):
        msg = f"labels must be distinct (ignoring case), got {names!r}."
        raise InputError(msg)
    lookup = dict(zip(folded, names, strict=True))

    def one(value: object, text: str) -> str:
        if isinstance(value, str):
            key = value.strip().strip("\"'`.,;:!*").strip().casefold()
            if key in lookup:
                return lookup[key]
        msg = f"expected one of {names!r}, got {_shorten(text.strip())!r}"
        raise ParseError(msg)

    def parse(text: str) -> Any:
        value: Any
        _require_text(text)
        try:
            value = _json_object(text)
        except ParseError:
            value = text
        if isinstance(value, dict) and "answer" in value:
            value = value["answer"]
        if not multi:
            return one(value, text)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
            if not value:  # text naming no label: only an explicit [] means "none applies"
                msg = (
                    f"expected a list of labels from {names!r} ([] when none applies), "
                    f"got {_shorten(text.strip())!r}"
                )
                raise ParseError(msg)
        if not isinstance(value, list):
            msg = f"expected a list of labels from {names!r}, got {_shorten(text.strip())!r}"
            raise ParseError(msg)
        chosen = {one(v, text) for v in value}
        return [x for x in names if x in chosen]

    if multi:
        item = {"type": "string", "enum": names}
        answer: dict[str, Any] = {"type": "array", "items": item, "uniqueItems": True}
        instruction = (
            f"Choose every label that applies from {names!r}. Answer with a JSON object: "
            '{"answer": [...labels...]}.'
        )
    else:
        answer = {"type": "string", "enum": names}
        instruction = (
            f"Choose exactly one label from {names!r}. Answer with a JSON object: "
            '{"answer": "<label>"}.'
        )
    schema = {
        "type": "object",
        "properties": {"answer": answer},
        "required": ["answer"],
        "additionalProperties": False,
    }
    return OutputSpec("labels" if multi else "label", schema, instruction, parse)


_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:)?')


def _label_spans(text: str, labels: Sequence[str]) -> list[tuple[str, int, int]]:
    """``(label, start, end)`` of each label value spelled in ``text``, first occurrence each.

    JSON string values (not keys) whose content is a label (ignoring case and
    surrounding punctuation, as :func:`label_spec` parses) count; without any,
    the first case-insensitive occurrence of each label in the bare text.
    """
    lookup = {x.strip().casefold(): x for x in labels}
    found: dict[str, tuple[int, int]] = {}
    for m in _JSON_STRING.finditer(text):
        if m.group(2):
            continue
        key = m.group(1).strip().strip("'`.,;:!*").strip().casefold()
        if key in lookup and lookup[key] not in found:
            found[lookup[key]] = (m.start(1), m.end(1))
    if not found:
        folded = text.casefold()
        for key, label in lookup.items():
            at = folded.find(key)
            if at >= 0:
                found[label] = (at, at + len(key))
    return [(label, a, b) for label, (a, b) in found.items()]


def _aligned(text: str, tokens: Sequence[TokenLogprob]) -> tuple[str, list[int]] | None:
    """The answer as generated (the tokens joined) and each token's start in it.

    ``None`` unless the tokens contain ``text``: a parser may have cut a code
    fence around the answer, but the tokens must be the answer's.
    """
    joined = "".join(t.token for t in tokens)
    if text not in joined:
        return None
    ends = itertools.accumulate((len(t.token) for t in tokens), initial=0)
    return joined, list(ends)[: len(tokens)]


def _token_at(starts: Sequence[int], tokens: Sequence[TokenLogprob], pos: int) -> int:
    """Index of the token that covers character ``pos``."""
    return next(i for i, s in enumerate(starts) if s + len(tokens[i].token) > pos)


def label_confidence(
    text: str, tokens: Sequence[TokenLogprob], labels: Sequence[str]
) -> dict[str, float]:
    """Probability of each label spelled in ``text``, from the answer's token logprobs.

    For every label found in the answer (a JSON string value, or the bare
    text), the tokens that overlap its characters are taken. Each contributes
    its probability renormalised over its reported top alternatives that would
    still spell *some* label at that place: ``p(chosen) / sum(p(t) for valid
    t)``. This is the probability of the label under the constrained answer,
    as far as the top alternatives show it; a token reported without
    alternatives contributes its plain probability. The label's confidence is
    the product over its tokens. Labels whose tokens do not line up with the
    text (the tokens do not spell ``text``) are left out.

    Parameters
    ----------
    text : str
        The raw answer.
    tokens : sequence of TokenLogprob
        The answer's tokens, in order; their texts joined must contain ``text``.
    labels : sequence of str
        The valid labels.

    Returns
    -------
    dict of str to float
        Confidence of each label present in the answer.

    Examples
    --------
    >>> from semframe.backends.base import TokenLogprob as T
    >>> import math
    >>> toks = [T('{"answer": "', 0.0), T("com", math.log(0.6), (("com", math.log(0.6)),
    ...         ("hor", math.log(0.2)), ("The", math.log(0.1)))), T('edy"}', math.log(0.9))]
    >>> round(label_confidence('{"answer": "comedy"}', toks, ["horror", "comedy"])["comedy"], 3)
    0.675

    ``0.6 / (0.6 + 0.2)`` for the first token ("The" spells no label), times
    ``0.9`` for the second, reported without alternatives.
    """
    aligned = _aligned(text, tokens)
    if aligned is None:
        return {}
    text, starts = aligned
    out: dict[str, float] = {}
    for label, start, end in _label_spans(text, labels):
        first = _token_at(starts, tokens, start)
        head = text[starts[first] : start]
        close = text[end : end + 1] if text[end : end + 1] == '"' else ""
        targets = [(head + x + close).casefold() for x in labels]
        confidence = 1.0
        for i in range(first, len(tokens)):
            if starts[i] >= end:
                break
            tok = tokens[i]
            p = math.exp(tok.logprob)
            if not tok.top:
                confidence *= p
                continue
            before = text[starts[first] : starts[i]]
            valid = {tok.token: tok.logprob}
            for alt, lp in tok.top:
                cand = (before + alt).casefold()
                if any(t.startswith(cand) or cand.startswith(t) for t in targets):
                    valid.setdefault(alt, lp)
            confidence *= p / sum(math.exp(lp) for lp in valid.values())
        out[label] = confidence
    return out


def label_distribution(
    text: str, tokens: Sequence[TokenLogprob], labels: Sequence[str]
) -> dict[str, float] | None:
    """The model's probability of every label at the place its answer names one.

    Where :func:`label_confidence` rates the label the answer chose, this
    spreads the probability over all labels: at each token of the chosen
    label, every reported alternative that would start spelling some label
    (case ignored, leading spaces allowed at the label's first token) gives
    its share to the labels it is compatible with (split evenly when several
    are); the chosen path carries the rest on to the next token, and what is
    left when the label is spelled goes to it. Labels no alternative names
    share the probability the reported alternatives leave over, so a label
    outside the top alternatives gets a small positive value rather than 0.
    The result sums to 1. A backend reports the distribution before a
    grammar constrains the answer (llama.cpp does), which is what makes this
    the model's own preference.

    Parameters
    ----------
    text : str
        The raw answer.
    tokens : sequence of TokenLogprob
        The answer's tokens, in order; their texts joined must contain ``text``.
    labels : sequence of str
        The valid labels (distinct ignoring case).

    Returns
    -------
    dict of str to float or None
        Every label's probability; ``None`` when the answer names no label or
        its tokens do not spell ``text`` (with anything around it).

    Examples
    --------
    >>> from semframe.backends.base import TokenLogprob as T
    >>> import math
    >>> toks = [T('{"answer": "', 0.0), T("yes", math.log(0.6), (("yes", math.log(0.6)),
    ...         ("no", math.log(0.3)), ("Yes", math.log(0.05)))), T('"}', 0.0)]
    >>> d = label_distribution('{"answer": "yes"}', toks, ["yes", "no"])
    >>> {k: round(v, 3) for k, v in d.items()}
    {'yes': 0.684, 'no': 0.316}

    ``0.65 / 0.95`` for yes ("yes" and "Yes"), ``0.3 / 0.95`` for no; the
    5% no alternative was reported for is shared by no label.
    """
    aligned = _aligned(text, tokens)
    if aligned is None:
        return None
    text, starts = aligned
    spans = _label_spans(text, labels)
    if not spans:
        return None
    chosen, start, end = spans[0]
    first = _token_at(starts, tokens, start)
    head = text[starts[first] : start].casefold()
    folded = {x: x.strip().casefold() for x in labels}
    mass = dict.fromkeys(labels, 0.0)
    carried = 1.0
    unclaimed = 0.0
    for i in range(first, len(tokens)):
        if starts[i] >= end:
            break
        tok = tokens[i]
        before = text[starts[first] : starts[i]].casefold()
        options = dict(tok.top) if tok.top else {}
        options.setdefault(tok.token, tok.logprob)
        claims: dict[str, tuple[float, list[str]]] = {}
        for alt, lp in options.items():
            spelled = (before + alt).casefold()
            if not spelled.startswith(head):
                continue
            rest = spelled[len(head) :]
            rest = rest.lstrip() if i == first else rest
            if not rest:
                continue
            fits = [x for x, f in folded.items() if f.startswith(rest) or rest.startswith(f)]
            if fits:
                claims[alt] = (math.exp(lp), fits)
        if tok.token not in claims:
            break
        total = sum(p for p, _ in claims.values())
        reported = sum(math.exp(lp) for lp in options.values())
        if i == first:
            unclaimed = max(0.0, 1.0 - reported) / total
        for alt, (p, fits) in claims.items():
            if alt != tok.token:
                for x in fits:
                    mass[x] += carried * p / total / len(fits)
        carried *= claims[tok.token][0] / total
    mass[chosen] += carried
    missing = [x for x, v in mass.items() if v == 0.0]
    for x in missing:
        mass[x] = unclaimed / len(missing) if unclaimed > 0 else 1e-6
    norm = sum(mass.values())
    return {x: v / norm for x, v in mass.items()}


def minimal_instance(schema: Mapping[str, Any], seed: str, path: str = "") -> Any:
    """A small value valid under ``schema``, chosen deterministically from ``seed``.

    Supports ``enum``/``const``, ``object`` (every listed property), ``array``
    (``minItems`` copies), ``string``, ``integer``, ``number``, ``boolean``,
    ``null``, ``anyOf``/``oneOf`` (first branch) and ``$ref`` into ``$defs``
    (not resolved: an empty object).

    Examples
    --------
    >>> minimal_instance({"type": "object", "properties": {"n": {"type": "integer"}}}, "x")
    {'n': 0}
    """
    h = hashlib.blake2b((seed + "\x00" + path).encode("utf-8"), digest_size=16).digest()
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = list(schema["enum"])
        return options[h[0] % len(options)] if options else None
    for combo in ("anyOf", "oneOf", "allOf"):
        if schema.get(combo):
            return minimal_instance(schema[combo][0], seed, path)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: minimal_instance(v, seed, f"{path}/{k}") for k, v in props.items()}
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        n = int(schema.get("minItems", 0))
        return [minimal_instance(items, seed, f"{path}/{i}") for i in range(n)]
    if kind == "string":
        return f"v{h.hex()[:6]}"
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return bool(h[0] & 1)
    return None
