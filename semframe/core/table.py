"""Frame-neutral tables: the rendered text of the columns a relQuery uses.

pandas and Polars specifics stop here: a frame is converted once, column by
column, into a :class:`Table` of strings, and everything downstream (planner,
reordering, estimator) works on that.

Cell rendering is deterministic:

- strings as they are; numbers as Python writes them (``3``, ``2.5``, ``1e+20``);
- booleans as ``true`` / ``false``;
- dates and datetimes in ISO 8601 (``2024-05-01``, ``2024-05-01T13:45:00``);
- missing values (``None``, ``NaN``, ``NaT``, ``pd.NA``) as ``<missing>``;
- lists and mappings as compact JSON; bytes as UTF-8 text when they decode,
  else as ``0x``-prefixed hex.

A prompt's fields are ``name: value`` lines, so a value must not be able to
start a line of its own: it could forge another field (``movie: Alien``) or
end the field block. Every line break inside a rendered value (``\\n``,
``\\r\\n`` and the other breaks of :meth:`str.splitlines`) is therefore
followed by two spaces: continuation lines are indented, and every line of
the field block that starts at column 0 starts a real field. Nothing else is
changed, and the original text is recovered by removing those two spaces
(:func:`unfence`).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from semframe.errors import InputError

Codes = np.ndarray[Any, np.dtype[np.signedinteger[Any]]]
"""Codes into a column's distinct values, in the narrowest integer type that holds them."""

Coded = tuple[Sequence[str], Codes]
"""A column factorized: its distinct values, first seen first, and each row's code into them.

The values are a tuple of strings, or :class:`ArrowValues` for a column of
Arrow strings that are mostly distinct (free text): those stay in Arrow.
"""

MISSING = "<missing>"
"""How a missing cell is rendered in a prompt."""


_BREAK = re.compile("(\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])")
_FENCED = re.compile("(\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])  ")


def fence(text: str) -> str:
    r"""Indent the lines after the first by two spaces, so a value cannot start a line.

    Examples
    --------
    >>> fence("tense\nmovie: Fake")
    'tense\n  movie: Fake'
    >>> fence("one line") == "one line" and unfence(fence("a\r\n\nb")) == "a\r\n\nb"
    True
    """
    if text.isprintable():  # no line break of any kind (fast path)
        return text
    return _BREAK.sub("\\1  ", text)


def unfence(text: str) -> str:
    r"""The inverse of :func:`fence`: the value as it was before rendering.

    Examples
    --------
    >>> unfence("tense\n  movie: Fake")
    'tense\nmovie: Fake'
    """
    return _FENCED.sub("\\1", text)


def render_value(value: object) -> str:
    r"""Render one cell value as prompt text (line breaks fenced, see the module docs).

    Examples
    --------
    >>> [render_value(v) for v in ["a", 3, 2.5, True, None, float("nan")]]
    ['a', '3', '2.5', 'true', '<missing>', '<missing>']
    >>> render_value(_dt.date(2024, 5, 1)), render_value(_dt.datetime(2024, 5, 1, 13, 45))
    ('2024-05-01', '2024-05-01T13:45:00')
    >>> render_value(["x", 1]), render_value({"k": None})
    ('["x", 1]', '{"k": null}')
    >>> render_value("first line\nreview: forged")
    'first line\n  review: forged'
    """
    text = _render(value)
    return text if text.isprintable() else fence(text)


def _render(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return MISSING if math.isnan(value) else repr(value)
    if isinstance(value, decimal.Decimal):
        return MISSING if value.is_nan() else str(value)
    if isinstance(value, _dt.datetime):
        return MISSING if value != value else _render_datetime(value)  # NaT != NaT
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + raw.hex()
    return _render_other(value)


def _render_datetime(value: _dt.datetime) -> str:
    if value.tzinfo is None and value.time() == _dt.time(0) and not value.microsecond:
        return value.date().isoformat()
    return value.isoformat()


def _render_other(value: object) -> str:
    # numpy scalars, pandas scalars and containers: avoid importing pandas/numpy here.
    type_name = type(value).__name__
    module = type(value).__module__
    if type_name in {"NaTType", "NAType"}:
        return MISSING
    if module.startswith("pandas") and type_name == "Timestamp":
        return _render_datetime(value.to_pydatetime())  # type: ignore[attr-defined]
    if module.startswith("pandas") and type_name == "Timedelta":
        return str(value.to_pytimedelta())  # type: ignore[attr-defined]
    if module == "numpy":
        if type_name.startswith("datetime64"):
            if np.isnat(value):  # type: ignore[call-overload]
                return MISSING
            return render_value(value.astype("datetime64[us]").item())  # type: ignore[attr-defined]
        if type_name == "ndarray":
            return render_value(value.tolist())  # type: ignore[attr-defined]
        if hasattr(value, "item"):
            return render_value(value.item())
    if isinstance(value, Mapping):
        return json.dumps(_jsonable(value), ensure_ascii=False, sort_keys=False)
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and hasattr(value, "__len__")):
        return json.dumps(_jsonable(value), ensure_ascii=False)
    if isinstance(value, (set, frozenset)):
        return json.dumps(sorted(_jsonable(list(value)), key=repr), ensure_ascii=False)
    return str(value)


def _jsonable(value: Any) -> Any:
    """Convert nested containers to JSON-able values, cells rendered for leaves."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    return render_value(value)


def render_column(values: Sequence[object]) -> tuple[str, ...]:
    """Render a column of cell values; fast for columns that are already text.

    Examples
    --------
    >>> render_column(["a", None, 1])
    ('a', '<missing>', '1')
    """
    return tuple([v if type(v) is str and v.isprintable() else render_value(v) for v in values])


def factorize(cells: Sequence[str]) -> tuple[list[str], Codes]:
    """The distinct values of ``cells``, first seen first, and each cell's code into them.

    The codes take the narrowest integer type that holds them (a byte a row
    for up to 127 distinct values).

    Examples
    --------
    >>> values, codes = factorize(["b", "a", "b"])
    >>> values, codes.tolist(), codes.dtype.name
    (['b', 'a'], [0, 1, 0], 'int8')
    """
    distinct = dict.fromkeys(cells)
    dtype = code_dtype(len(distinct))
    if len(distinct) == len(cells):  # every value once (free text): each row is its own code
        return list(distinct), np.arange(len(cells), dtype=dtype)
    index = dict(zip(distinct, range(len(distinct)), strict=True))
    return list(distinct), np.fromiter(map(index.__getitem__, cells), dtype, len(cells))


_TAKE = 1 << 16
"""Values turned into Python strings at a time where :class:`ArrowValues` are read in order."""


def position(index: int, n: int, what: str) -> int:
    """``index`` into ``n`` items as a position (negative from the end), or an ``IndexError``.

    Examples
    --------
    >>> position(-1, 3, "value"), position(2, 3, "value")
    (2, 2)
    >>> position(3, 3, "value")
    Traceback (most recent call last):
    ...
    IndexError: value index 3 out of range for 3 values
    """
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        msg = f"{what} index {index} out of range for {n} {what}s"
        raise IndexError(msg)
    return i


@dataclass(frozen=True, slots=True, eq=False)
class ArrowValues(Sequence[str]):
    """Distinct text values that stay in an Arrow string array until they are read.

    ``values[k]`` is the text of row ``at[k]`` of ``source`` (of row ``k``
    when ``at`` is ``None``). Free text (a review, a document) is held once,
    as the frame holds it: no Python string per row, and none per distinct
    value; reading values (:meth:`take`, iterating) makes strings of those
    alone. The lengths the planner needs come from Arrow without making any
    (:meth:`char_lengths`, :meth:`byte_lengths`).

    Parameters
    ----------
    source : pyarrow Array or ChunkedArray
        ``string`` or ``large_string``, no nulls.
    at : ndarray of int, optional
        The row of ``source`` of each value; ``None``: every row, in order.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa
    >>> v = ArrowValues(pa.array(["b", "a", "b", "c"]), np.array([0, 1, 3]))
    >>> len(v), v[2], list(v), v.take(np.array([2, 2, 0]))
    (3, 'c', ['b', 'a', 'c'], ['c', 'c', 'b'])
    >>> "a" in v, v.index("c"), v.view(np.array([1, 0]))[0], v.char_lengths().tolist()
    (True, 2, 'a', [1, 1, 1])
    >>> list(v.compact(np.array([2, 0]))), len(v.compact(np.array([2])).source)
    (['c', 'b'], 1)
    """

    source: Any
    at: NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return len(self.source) if self.at is None else int(self.at.size)

    def _rows(self, positions: NDArray[np.integer[Any]]) -> NDArray[np.integer[Any]]:
        return positions if self.at is None else self.at[positions]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.view(np.arange(len(self))[index])
        i = position(index, len(self), "value")
        row = i if self.at is None else int(self.at[i])
        text: str = self.source[row].as_py()
        return text

    def __iter__(self) -> Iterator[str]:
        n = len(self)
        for lo in range(0, n, _TAKE):
            yield from self.take(np.arange(lo, min(lo + _TAKE, n)))

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and self._find(value) >= 0

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The position of ``value`` (``start`` and ``stop`` as :meth:`list.index`)."""
        found = self._find(value) if isinstance(value, str) else -1
        stop = len(self) if stop is None else stop
        if found < 0 or not start <= found < stop:
            msg = f"{value!r} is not among the values"
            raise ValueError(msg)
        return found

    def _find(self, value: str) -> int:
        """The position of ``value`` among the values, or -1 (they are distinct)."""
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        rows = np.flatnonzero(pc.equal(self.source, value).to_numpy(zero_copy_only=False))
        if self.at is None:
            return int(rows[0]) if rows.size else -1
        hit = np.flatnonzero(np.isin(self.at, rows))
        return int(hit[0]) if hit.size else -1

    def take(self, positions: NDArray[np.integer[Any]]) -> list[str]:
        """The values at ``positions``, as Python strings (one per position)."""
        import pyarrow as pa

        rows = self._rows(np.asarray(positions, dtype=np.int64))
        taken: list[str] = self.source.take(pa.array(rows, type=pa.int64())).to_pylist()
        return taken

    def view(self, positions: NDArray[np.integer[Any]]) -> ArrowValues:
        """The values at ``positions``, still in Arrow (nothing is copied but positions)."""
        rows = self._rows(np.asarray(positions, dtype=np.int64))
        return ArrowValues(self.source, rows.astype(np.int64, copy=False))

    def compact(self, positions: NDArray[np.integer[Any]]) -> ArrowValues:
        """The values at ``positions`` copied into an array of their own (to send elsewhere)."""
        import pyarrow as pa

        rows = self._rows(np.asarray(positions, dtype=np.int64))
        return ArrowValues(self.source.take(pa.array(rows, type=pa.int64())))

    def char_lengths(self) -> NDArray[np.int64]:
        """Each value's length in characters (Python's ``len``), from Arrow."""
        import pyarrow.compute as pc

        counted = pc.utf8_length(self.source).to_numpy(zero_copy_only=False)
        lengths: NDArray[np.int64] = np.asarray(counted, dtype=np.int64)
        return lengths if self.at is None else lengths[self.at]

    def byte_lengths(self) -> NDArray[np.int64]:
        """Each value's UTF-8 bytes, read from Arrow's offsets."""
        lengths = _arrow_utf8(self.source)[0]
        return lengths if self.at is None else lengths[self.at]

    def __repr__(self) -> str:
        return f"ArrowValues({len(self):,} values)"


def take_values(values: Sequence[str], positions: NDArray[np.integer[Any]]) -> list[str]:
    """``values`` at ``positions`` as a list: in one step from Arrow, else by index.

    Examples
    --------
    >>> import numpy as np
    >>> take_values(("x", "y"), np.array([1, 1, 0]))
    ['y', 'y', 'x']
    """
    if isinstance(values, ArrowValues):
        return values.take(positions)
    return list(map(values.__getitem__, positions.tolist()))


def char_lengths(values: Sequence[str]) -> NDArray[np.int64]:
    """Each value's length in characters (from Arrow for :class:`ArrowValues`).

    Examples
    --------
    >>> char_lengths(("ab", "")).tolist()
    [2, 0]
    """
    if isinstance(values, ArrowValues):
        return values.char_lengths()
    return np.fromiter(map(len, values), np.int64, len(values))


def factorize_arrow(source: Any) -> Coded:
    """:func:`factorize` of an Arrow string array (no nulls), its values left in Arrow.

    Each value is hashed once, a chunk of strings at a time (only the chunk is
    ever held as Python strings); rows whose hashes are unique are distinct,
    and only rows sharing a hash are compared as text. The values are
    :class:`ArrowValues` at each one's first row; the codes number them first
    seen first, as :func:`factorize` does.

    Examples
    --------
    >>> import pyarrow as pa
    >>> values, codes = factorize_arrow(pa.array(["b", "a", "b"]))
    >>> list(values), codes.tolist(), codes.dtype.name
    (['b', 'a'], [0, 1, 0], 'int8')
    """
    n = len(source)
    hashes = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _TAKE):
        chunk = source.slice(lo, _TAKE).to_pylist()
        hashes[lo : lo + len(chunk)] = np.fromiter(map(hash, chunk), np.int64, len(chunk))
    by_hash = np.argsort(hashes, kind="stable")  # rows of one hash in row order
    ordered = hashes[by_hash]
    same = ordered[1:] == ordered[:-1]
    del hashes, ordered
    if not same.any():  # every hash once: every value once
        return ArrowValues(source), np.arange(n, dtype=code_dtype(n))
    # Rows that share a hash with another: compared as text, each to the first of its value.
    shared = np.zeros(n, dtype=bool)
    shared[1:] |= same
    shared[:-1] |= same
    del same
    candidates = np.sort(by_hash[shared])
    del by_hash, shared
    first = np.arange(n, dtype=np.int64)
    seen: dict[str, int] = {}  # each candidate value's first row (rows come in order)
    whole = ArrowValues(source)
    for lo in range(0, candidates.size, _TAKE):
        rows = candidates[lo : lo + _TAKE]
        texts = whole.take(rows)
        first[rows] = [seen.setdefault(t, r) for t, r in zip(texts, rows.tolist(), strict=True)]
    del seen
    is_first = first == np.arange(n)
    at = np.flatnonzero(is_first)
    dtype = code_dtype(at.size)
    code_of_first = np.empty(n, dtype=dtype)
    code_of_first[at] = np.arange(at.size, dtype=dtype)
    codes = code_of_first[first]
    return ArrowValues(source, at.astype(np.int64)), codes


def code_dtype(distinct: int) -> np.dtype[np.signedinteger[Any]]:
    """The narrowest signed integer type holding the codes ``0 .. distinct - 1`` (and -1).

    Examples
    --------
    >>> [code_dtype(k).name for k in (1, 128, 40_000, 2**31)]
    ['int8', 'int16', 'int32', 'int64']
    """
    for dtype in (np.int8, np.int16, np.int32):
        if distinct <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


@dataclass(frozen=True, slots=True)
class Table:
    """The rendered text of some columns of a frame.

    Attributes
    ----------
    columns : tuple of str
        Column names, as the template names them.
    cells : mapping of str to tuple of str
        ``cells[c][r]`` is the rendered text of row ``r`` in column ``c``.
    n_rows : int
        Number of rows.

    Examples
    --------
    >>> t = Table.from_columns({"a": ["x", "y"], "b": [1, None]})
    >>> t.n_rows, t.columns, t.cells["b"]
    (2, ('a', 'b'), ('1', '<missing>'))
    >>> t.row(1)
    {'a': 'y', 'b': '<missing>'}
    """

    columns: tuple[str, ...]
    cells: Mapping[str, tuple[str, ...]]
    n_rows: int
    _coded: dict[str, Coded] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def from_columns(cls, data: Mapping[str, Sequence[object]]) -> Table:
        """Build a table from a mapping of column name to cell values."""
        columns = tuple(data)
        lengths = {len(v) for v in data.values()}
        if len(lengths) > 1:
            msg = f"columns have different lengths: { {k: len(v) for k, v in data.items()} }"
            raise InputError(msg)
        n = lengths.pop() if lengths else 0
        return cls(columns, {c: render_column(list(data[c])) for c in columns}, n)

    def coded(self, column: str) -> Coded:
        """:func:`factorize` of ``column``'s cells, computed once per table.

        The planner, the reorderer and the restated question each read a
        column's distinct values and codes; they share one factorization.
        The codes are read-only.

        Examples
        --------
        >>> t = Table.from_columns({"a": ["y", "x", "y"]})
        >>> values, codes = t.coded("a")
        >>> values, codes.tolist(), t.coded("a")[1] is codes
        (('y', 'x'), [0, 1, 0], True)
        """
        found = self._coded.get(column)
        if found is None:
            source = self.arrow(column)
            if source is not None and _free_text(source):  # stays in Arrow
                found = self._coded[column] = factorize_arrow(source)
                found[1].flags.writeable = False
                return found
            cells = self.cells[column]
            # Arrow's dictionary encoding, where it made the cells (ArrowCells).
            found = self.cells.coded.get(column) if isinstance(self.cells, ArrowCells) else None
            if found is None:
                values, codes = factorize(cells)
                codes.flags.writeable = False
                found = (tuple(values), codes)
            self._coded[column] = found
        return found

    def arrow(self, column: str) -> Any:
        """The Arrow string array whose values ``column``'s cells are, as they are; or ``None``.

        Such a column (none missing, none spanning lines) is turned into
        Python strings only when its cells are first read (:class:`ArrowCells`).
        """
        return self.cells.source(column) if isinstance(self.cells, ArrowCells) else None

    def utf8(self, column: str) -> tuple[NDArray[np.int64], list[Any]]:
        """``column``'s cells in UTF-8: each cell's length in bytes, and the bytes.

        The bytes come as buffers, to be read in order (their concatenation is
        the cells' text, one after another). For a column of Arrow strings
        rendered as they are, they are the array's own buffers: nothing is
        joined or encoded.

        Examples
        --------
        >>> lengths, parts = Table.from_columns({"a": ["x", "\u00e9", ""]}).utf8("a")
        >>> lengths.tolist(), b"".join(parts)
        ([1, 2, 0], b'x\xc3\xa9')
        """
        source = self.arrow(column)
        if source is not None:
            return _arrow_utf8(source)
        cells = self.cells[column]
        text = "".join(cells).encode("utf-8", "surrogatepass")
        lengths = np.fromiter(map(len, cells), dtype=np.int64, count=len(cells))
        if int(lengths.sum()) != len(text):  # not all ASCII: a character may take 2-4 bytes
            utf8 = (len(c.encode("utf-8", "surrogatepass")) for c in cells)
            lengths = np.fromiter(utf8, dtype=np.int64, count=len(cells))
        return lengths, [text]

    def row(self, r: int) -> dict[str, str]:
        """The rendered cells of row ``r``, by column."""
        return {c: self.cells[c][r] for c in self.columns}

    def select(self, columns: Sequence[str]) -> Table:
        """A table with only ``columns`` (in that order)."""
        if isinstance(self.cells, ArrowCells):
            cells: Mapping[str, tuple[str, ...]] = self.cells.select(columns)
        else:
            cells = {c: self.cells[c] for c in columns}
        table = Table(tuple(columns), cells, self.n_rows)
        table._coded.update((c, self._coded[c]) for c in columns if c in self._coded)
        return table

    def take(self, rows: Sequence[int]) -> Table:
        """A table with only the rows at positions ``rows`` (in that order).

        Columns still in Arrow stay there (:meth:`ArrowCells.take`): taking
        a few rows of a large frame converts none of its cells.

        Examples
        --------
        >>> t = Table.from_columns({"a": ["x", "y", "z"]})
        >>> t.take([2, 0]).cells["a"], t.take([]).n_rows
        (('z', 'x'), 0)
        """
        if isinstance(self.cells, ArrowCells):
            return Table(self.columns, self.cells.take(rows), len(rows))
        return Table(
            self.columns,
            {c: tuple(map(v.__getitem__, rows)) for c, v in self.cells.items()},
            len(rows),
        )


def as_table(frame: object, columns: Sequence[str] | None = None) -> Table:
    """Convert a pandas or Polars frame (or a :class:`Table`) into a :class:`Table`.

    Only ``columns`` are converted (all columns when ``None``), and column names
    are converted to ``str``.

    Examples
    --------
    >>> as_table({"a": [1, 2]}).cells
    {'a': ('1', '2')}
    """
    if isinstance(frame, Table):
        return frame if columns is None else frame.select(columns)
    if isinstance(frame, Mapping):
        data = {str(k): list(v) for k, v in frame.items()}
        if columns is not None:
            data = {c: data[c] for c in columns}
        return Table.from_columns(data)
    pd, pl = sys.modules.get("pandas"), sys.modules.get("polars")
    if pd is not None and isinstance(frame, pd.DataFrame):  # subclasses too
        return from_pandas(frame, columns)
    if pl is not None and isinstance(frame, pl.DataFrame):
        return from_polars(frame, columns)
    raise unsupported_frame(frame)


def unsupported_frame(frame: object) -> InputError:
    """The error for an object that is not a supported frame, naming the supported ones."""
    msg = (
        f"unsupported frame type {type(frame).__module__}.{type(frame).__qualname__}; "
        "semframe works on pandas.DataFrame, polars.DataFrame and polars.LazyFrame."
    )
    return InputError(msg)


def from_pandas(frame: Any, columns: Sequence[str] | None) -> Table:
    """The rendered text of ``columns`` of a pandas frame (all when ``None``)."""
    by_name = {str(c): c for c in frame.columns}
    names = list(by_name) if columns is None else list(columns)
    rendered = {name: _render_pandas_series(frame[by_name[name]]) for name in names}
    return _table(names, rendered, len(frame))


def _table(names: Sequence[str], rendered: Mapping[str, Rendered], n: int) -> Table:
    """A table of rendered columns, with the factorizations that came with them."""
    sources = {name: rendered[name][2] for name in names if rendered[name][2] is not None}
    cells = {name: rendered[name][0] for name in names}
    if sources:
        table = Table(tuple(names), ArrowCells(cells, sources), n)
    else:
        table = Table(tuple(names), cast("dict[str, tuple[str, ...]]", cells), n)
    for name in names:
        coded = rendered[name][1]
        if coded is not None:
            coded[1].flags.writeable = False
            table._coded[name] = coded
    return table


Rendered = tuple[tuple[str, ...] | None, Coded | None, Any]
"""A column's rendered cells and their :func:`factorize` when it came for free; or
``None`` and the Arrow string array whose values they are (see :class:`ArrowCells`)."""


class ArrowCells(Mapping[str, tuple[str, ...]]):
    """A table's cells by column, where Arrow string columns become Python strings on first use.

    A column whose cells are an Arrow string array's values as they are
    (:func:`_render_arrow_strings`: none missing, none spanning lines) is kept
    as that array until its cells are read: a re-run served whole from the
    result cache reads none (its fingerprint reads Arrow's buffers,
    :meth:`Table.utf8`) and never holds a Python string per row of them.
    Read, a column is what :func:`_shared_strings` makes of it (one object
    per distinct value where the values repeat, and Arrow's dictionary
    encoding as its factorization, :attr:`coded`).

    Examples
    --------
    >>> import pyarrow as pa
    >>> cells = ArrowCells({"a": ("x",), "b": None}, {"b": pa.array(["y"])})
    >>> cells.source("b") is not None, dict(cells), cells.source("b")
    (True, {'a': ('x',), 'b': ('y',)}, None)
    """

    __slots__ = ("_cells", "_sources", "coded")

    def __init__(
        self, cells: Mapping[str, tuple[str, ...] | None], sources: Mapping[str, Any]
    ) -> None:
        self._cells = dict(cells)
        self._sources = dict(sources)
        self.coded: dict[str, Coded] = {}

    def source(self, column: str) -> Any:
        """``column``'s Arrow array while its cells are unread; ``None`` once read or never one."""
        return self._sources.get(column) if self._cells.get(column) is None else None

    def __getitem__(self, column: str) -> tuple[str, ...]:
        found = self._cells[column]
        if found is None:
            out, coded = _shared_strings(self._sources[column])
            found = self._cells[column] = tuple(out)
            if coded is not None:
                coded[1].flags.writeable = False
                self.coded[column] = coded
        return found

    def select(self, columns: Sequence[str]) -> ArrowCells:
        """Only ``columns``; those not read yet are still unread."""
        chosen = {c: self._cells[c] for c in columns}
        picked = ArrowCells(chosen, {c: self._sources[c] for c in columns if chosen[c] is None})
        picked.coded.update((c, self.coded[c]) for c in columns if c in self.coded)
        return picked

    def take(self, rows: Sequence[int]) -> ArrowCells:
        """The rows at positions ``rows``; columns not read yet are taken in Arrow, unread.

        Examples
        --------
        >>> import pyarrow as pa
        >>> cells = ArrowCells({"a": ("x", "y"), "b": None}, {"b": pa.array(["u", "v"])})
        >>> part = cells.take([1])
        >>> part.source("b").to_pylist(), dict(part)
        (['v'], {'a': ('y',), 'b': ('v',)})
        """
        import pyarrow as pa

        at = None
        cells: dict[str, tuple[str, ...] | None] = {}
        sources: dict[str, Any] = {}
        for column, found in self._cells.items():
            if found is None:
                if at is None:
                    at = pa.array(np.asarray(rows, dtype=np.int64), type=pa.int64())
                sources[column] = self._sources[column].take(at)
                cells[column] = None
            else:
                cells[column] = tuple(map(found.__getitem__, rows))
        return ArrowCells(cells, sources)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __repr__(self) -> str:
        return repr(dict(self))


def _render_pandas_series(col: Any) -> Rendered:
    kind = col.dtype.kind
    if isinstance(col.dtype, np.dtype) and kind in "iu":
        # Plain numpy integers: no missing values possible.
        return tuple(col.astype(str).tolist()), None, None
    if kind == "M" and getattr(col.dtype, "tz", None) is None:
        return _render_naive_datetimes(col.to_numpy(dtype="datetime64[us]")), None, None
    if type(col.dtype).__name__ == "StringDtype" and getattr(col.dtype, "storage", "") == "pyarrow":
        import pyarrow as pa

        return _render_arrow_strings(pa.array(col.array))
    if type(col.dtype).__name__ == "ArrowDtype":  # pd.ArrowDtype(pa.string()), as Ray Data gives
        import pyarrow as pa

        kind = col.dtype.pyarrow_dtype
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return _render_arrow_strings(pa.array(col.array))
    return render_column(col.tolist()), None, None


_BREAK_CHARS = "[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]"
"""A line break of any kind (:data:`_BREAK`, as a character class for Arrow's regex engine)."""


def _render_arrow_strings(values: Any) -> Rendered:
    """:func:`render_column` of an Arrow string array, vectorised, and its factorization.

    Missing values become :data:`MISSING`; only values holding a line break
    are fenced in Python. Strings are otherwise rendered as they are. Where
    Arrow's dictionary encoding made the cells (the values repeat), its codes
    are the cells' :func:`factorize` (Arrow numbers values in order of first
    appearance); not where a value was fenced. Where every value is rendered
    as it is (none missing or fenced), no cell is made here: ``None`` comes
    back with ``values``, which :class:`ArrowCells` turns into the cells on
    first use.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    broken = None
    if _may_break(values):
        found = pc.match_substring_regex(values, _BREAK_CHARS).fill_null(False)
        broken = found if pc.any(found).as_py() else None
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    plain = all(pa.types.is_string(c.type) or pa.types.is_large_string(c.type) for c in chunks)
    if broken is None and not values.null_count and plain:
        return None, None, values  # the values as they are: read on first use (ArrowCells)
    filled = pc.fill_null(values, MISSING) if values.null_count else values
    out, coded = _shared_strings(filled)
    if broken is not None:
        coded = None
        for i in np.flatnonzero(broken.to_numpy(zero_copy_only=False)).tolist():
            out[i] = fence(out[i])
    return tuple(out), coded, None


def _arrow_utf8(values: Any) -> tuple[NDArray[np.int64], list[Any]]:
    """:meth:`Table.utf8` of an Arrow ``string`` or ``large_string`` array without nulls."""
    import pyarrow as pa

    lengths: list[NDArray[np.int64]] = []
    parts: list[Any] = []
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        if not len(chunk):
            continue
        width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
        _, offsets, data = chunk.buffers()
        at = np.frombuffer(offsets, dtype=width)[chunk.offset : chunk.offset + len(chunk) + 1]
        lengths.append(np.diff(at).astype(np.int64))
        if data is not None and at[-1] > at[0]:
            parts.append(memoryview(data)[int(at[0]) : int(at[-1])])
    return (np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)), parts


_SCAN_BYTES = 1 << 22
"""Bytes :func:`_may_break` looks at in one step (its masks are this size, not the column's)."""


def _may_break(values: Any) -> bool:
    """Whether a value of an Arrow string array may hold a line break; ``False``: none does.

    The characters' bytes are read as they lie in memory: ASCII text whose
    only control character is the tab holds no line break (every ASCII
    break is below 0x20, and the others are not ASCII). Anything else is
    looked at value by value. Only the array's own values are read: a slice
    of a larger array (``df.head(10)`` of a large frame) shares its buffers,
    and the rest of them is not looked at.

    Examples
    --------
    >>> import pyarrow as pa
    >>> _may_break(pa.array(["a\\tb", None])), _may_break(pa.array(["a", "b\\rc"]))
    (False, True)
    >>> _may_break(pa.chunked_array([["a"], ["\\u2028"]]))
    True
    >>> _may_break(pa.array(["x\\ny", "plain", "text"]).slice(1))  # the break is not in it
    False
    """
    import pyarrow as pa

    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            return True
        _, offsets, data = chunk.buffers()
        if data is None or not data.size or not len(chunk):
            continue
        width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
        at = np.frombuffer(offsets, dtype=width)
        lo, hi = int(at[chunk.offset]), int(at[chunk.offset + len(chunk)])
        raw = np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo)
        for start in range(0, raw.size, _SCAN_BYTES):
            part = raw[start : start + _SCAN_BYTES]
            if part.max() >= 0x80:
                return True
            low = part[part < 0x20]
            if low.size and bool((low != 0x09).any()):
                return True
    return False


_SAMPLE = 2048
"""Leading values looked at to guess whether a column repeats its values."""


def _free_text(values: Any) -> bool:
    """Whether an Arrow string array holds free text: mostly distinct values, and many.

    Guessed from its first :data:`_SAMPLE` values (more than half distinct).
    A short column (fewer than twice that many values) is not: it costs
    little as Python strings.
    """
    head = values.slice(0, _SAMPLE)
    return len(values) >= 2 * _SAMPLE and bool(len(head.unique()) * 2 > len(head))


def _shared_strings(values: Any) -> tuple[list[str], Coded | None]:
    """An Arrow string array (no nulls) as Python strings, one object per distinct value.

    A column that repeats its values (a label, a category) then costs a
    pointer per row instead of a string, and hashing it later hits the
    string's cached hash; its dictionary encoding comes with it. Columns
    whose first values are mostly distinct are converted directly (encoding
    them would cost more than it saves).
    """
    import pyarrow as pa

    if len(values) < 2 * _SAMPLE or _free_text(values):
        return list(values.to_pylist()), None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    try:
        encoded = values.dictionary_encode()
    except pa.ArrowNotImplementedError:  # a string type Arrow cannot encode here
        return list(values.to_pylist()), None
    distinct = encoded.dictionary.to_pylist()
    if len(distinct) * 2 > len(values):
        return list(values.to_pylist()), None
    at = encoded.indices.to_numpy(zero_copy_only=False).astype(code_dtype(len(distinct)))
    shared: list[str] = np.asarray(distinct, dtype=object)[at].tolist()
    return shared, (tuple(distinct), at)


def _render_naive_datetimes(values: Any) -> tuple[str, ...]:
    """Vectorised :func:`render_value` for a numpy ``datetime64[us]`` array."""
    text = np.datetime_as_string(values, unit="s")
    micros = values.astype("int64") % 1_000_000
    midnight = (values - values.astype("datetime64[D]")).astype("int64") == 0
    out = np.where(midnight, np.char.ljust(text, 10).astype("<U10"), text).tolist()
    nat = np.isnat(values)
    for i in np.flatnonzero(nat | (micros != 0)).tolist():
        out[i] = MISSING if nat[i] else render_value(values[i].item())
    return tuple(out)


def from_polars(frame: Any, columns: Sequence[str] | None) -> Table:
    """The rendered text of ``columns`` of a Polars frame (all when ``None``)."""
    names = list(frame.columns) if columns is None else list(columns)
    rendered = {name: _render_polars_series(frame.get_column(name)) for name in names}
    return _table(names, rendered, frame.height)


def _render_polars_series(col: Any) -> Rendered:
    if str(col.dtype) == "String" and "pyarrow" in sys.modules:
        return _render_arrow_strings(col.to_arrow())
    return render_column(col.to_list()), None, None
