"""A plan's requests held as columns, each prompt rendered when it is asked for.

A relQuery of a million rows has a million prompts, and most of each prompt is
shared: the instruction block, then ``name: value`` segments whose values
repeat. :class:`Requests` keeps what makes each prompt (a code per field
depth into the fields' distinct values, the row, the prefix group, the
cacheable prefixes) and renders a prompt only when a request is read: one at a time
where a dispatcher takes them, a chunk at a time where all are read in order.
It is a ``Sequence[Request]``: code that indexes, slices or iterates a plan's
requests reads the same :class:`~semframe.core.wire.Request` values a tuple
held before, and the columns answer the questions asked of every request
(prompt lengths, UTF-8 bytes, rows) without rendering any.
"""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from semframe.core.table import ArrowValues, char_lengths, position, take_values
from semframe.core.wire import Request

__all__ = [
    "Joined",
    "Requests",
    "byte_lengths",
    "bytes_of",
    "chars_of",
    "group_ids_of",
    "ids_of",
    "prompts_of",
    "rows_of",
    "subset",
    "utf8_len",
    "with_options",
]

IntArray = NDArray[np.int64]
Levels = tuple[tuple[int, int], ...]

_CHUNK = 8192
"""Prompts rendered together when requests are read in order."""


@dataclass(frozen=True, eq=False)
class Joined(Sequence[str]):
    """Every field's distinct values, one field's after the one before it, each as it came.

    A field's values are a tuple of strings, or
    :class:`~semframe.core.table.ArrowValues` (free text left in Arrow): its
    strings are made only for the values read, a chunk of prompts at a time.

    Examples
    --------
    >>> v = Joined.of([("Alien", "Heat"), ("tense",)])
    >>> len(v), v[2], list(v), v.take(np.array([2, 0, 2])), v.starts.tolist()
    (3, 'tense', ['Alien', 'Heat', 'tense'], ['tense', 'Alien', 'tense'], [0, 2])
    """

    parts: tuple[Sequence[str], ...]
    starts: IntArray

    @classmethod
    def of(cls, parts: Sequence[Sequence[str]]) -> Joined:
        """The values of each field in ``parts``, joined."""
        sizes = [len(p) for p in parts]
        starts = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        return cls(tuple(p if isinstance(p, ArrowValues) else tuple(p) for p in parts), starts)

    @functools.cached_property
    def _starts(self) -> list[int]:
        starts: list[int] = self.starts.tolist()
        return starts

    def __len__(self) -> int:
        return int(self.starts[-1]) + len(self.parts[-1]) if self.parts else 0

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        i = position(index, len(self), "value")
        field = bisect_right(self._starts, i) - 1
        return self.parts[field][i - self._starts[field]]

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part

    def fields(self, codes: NDArray[np.integer[Any]]) -> NDArray[np.intp]:
        """The field each value of ``codes`` belongs to."""
        return np.searchsorted(self.starts, codes, side="right") - 1

    def take(
        self, codes: NDArray[np.integer[Any]], fields: NDArray[np.intp] | None = None
    ) -> list[str]:
        """The values ``codes`` as strings, a field's at once (``fields``: theirs, if known)."""
        codes = np.asarray(codes, dtype=np.int64)
        fields = self.fields(codes) if fields is None else fields
        if not codes.size:
            return []
        first = int(fields[0])
        if int(fields.min()) == int(fields.max()):  # one field (one order): the common case
            return take_values(self.parts[first], codes - self._starts[first])
        out = np.empty(codes.size, dtype=object)
        for field in np.unique(fields).tolist():
            at = fields == field
            out[at] = take_values(self.parts[field], codes[at] - self._starts[field])
        taken: list[str] = out.tolist()
        return taken

    def select(self, used: NDArray[np.integer[Any]]) -> Joined:
        """Only the values ``used`` (ascending), each field's copied out of what it came in.

        Free text in Arrow keeps only the values used: a shard sent to another
        process carries its own values, not the whole column.
        """
        fields = self.fields(used)
        parts: list[Sequence[str]] = []
        for field, part in enumerate(self.parts):
            local = np.asarray(used[fields == field], dtype=np.int64) - self._starts[field]
            if isinstance(part, ArrowValues):
                parts.append(part.compact(local))
            else:
                parts.append(tuple(map(part.__getitem__, local.tolist())))
        return Joined.of(parts)

    def char_lengths(self) -> IntArray:
        """Each value's length in characters."""
        return _concat([char_lengths(p) for p in self.parts])

    def byte_lengths(self) -> IntArray:
        """Each value's UTF-8 bytes (each value encoded once, or read from Arrow)."""
        return _concat([byte_lengths(p) for p in self.parts])

    def __repr__(self) -> str:
        return f"Joined({len(self):,} values of {len(self.parts)} fields)"


def _concat(arrays: list[IntArray]) -> IntArray:
    return np.concatenate(arrays).astype(np.int64, copy=False) if arrays else np.zeros(0, np.int64)


@dataclass(frozen=True, eq=False)
class Requests(Sequence[Request]):
    """Requests in execution order, rendered from the fields' distinct values on demand.

    The distinct values of every field are held once, a field's after the
    one before it (``starts[j]`` is field ``j``'s first); request ``i``'s
    prompt is ``head``, then for each field depth ``d`` the segment
    ``labels[j] + values[codes[d, i]] + "\\n"`` of the field ``j`` that value
    belongs to, then ``tails[i]`` (the restated question, when there is one).
    The values are the table's own strings: nothing is copied per row.

    Attributes
    ----------
    head : str
        What every prompt starts with (the instruction block and a blank line).
    labels : tuple of str
        Each field's label, ``"name: "``.
    values : sequence of str
        Every distinct value of every field (:class:`Joined`: each field's as
        it came, free text left in Arrow).
    starts : ndarray
        Where each field's values start in ``values`` (ascending; a field
        without values starts where the next one does).
    lengths : ndarray
        Characters of each value's segment, label and line break included.
    codes : ndarray
        Shape ``(fields, n)``: each request's value at each field depth.
    tails : sequence of str or None
        What follows each request's fields (``None``: nothing).
    ids, rows, groups : ndarray
        Each request's id, the row of the caller's frame it answers, and its
        prefix group.
    levels : sequence of tuple
        Each request's cacheable prefixes (:attr:`Request.prefix`).
    system, max_tokens, temperature, schema, logprobs, rel, rel_size
        Shared by every request (:class:`~semframe.core.wire.Request`).

    Examples
    --------
    >>> import numpy as np
    >>> rs = Requests.build("Rate it.\\n\\n", ("movie: ", "review: "),
    ...                     [("Alien", "Heat"), ("tense",)], np.array([[0, 1], [2, 2]]),
    ...                     rows=np.array([1, 0]), groups=np.array([0, 1]))
    >>> len(rs), rs[1].row, rs[1].prompt
    (2, 0, 'Rate it.\\n\\nmovie: Heat\\nreview: tense\\n')
    >>> [r.id for r in rs], rs.prompt_lengths().tolist() == [len(r.prompt) for r in rs]
    ([0, 1], True)
    >>> rs == tuple(rs), rs[1:].ids.tolist()
    (True, [1])
    """

    head: str
    labels: tuple[str, ...]
    values: Sequence[str]
    starts: IntArray
    lengths: IntArray
    codes: NDArray[np.signedinteger[Any]]
    tails: Sequence[str] | None
    ids: IntArray
    rows: IntArray
    groups: IntArray
    levels: Sequence[Levels]
    system: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    schema: Mapping[str, Any] | None = None
    logprobs: int = 0
    rel: str = ""
    rel_size: int = 0

    @classmethod
    def build(
        cls,
        head: str,
        labels: Sequence[str],
        values: Sequence[Sequence[str]],
        codes: NDArray[np.signedinteger[Any]],
        *,
        rows: IntArray,
        groups: IntArray,
        tails: Sequence[str] | None = None,
        levels: Sequence[Levels] | None = None,
        **options: Any,
    ) -> Requests:
        """Requests ``0 .. n - 1`` (``options``: the values every request shares).

        ``values[j]`` are field ``j``'s distinct values; ``codes[d, i]`` indexes
        them all, a field's after the one before it.
        """
        n = int(codes.shape[1])
        joined = Joined.of(values)
        sizes = [len(v) for v in joined.parts]
        lengths = joined.char_lengths() + 1
        lengths += np.repeat(np.fromiter(map(len, labels), np.int64, len(labels)), sizes)
        return cls(
            head,
            tuple(labels),
            joined,
            joined.starts,
            lengths,
            codes,
            None if tails is None else tuple(tails),
            np.arange(n, dtype=np.int64),
            np.asarray(rows, dtype=np.int64),
            np.asarray(groups, dtype=np.int64),
            tuple(levels) if levels is not None else (((len(head), n),),) * n,
            **options,
        )

    @functools.cached_property
    def _starts(self) -> list[int]:
        starts: list[int] = self.starts.tolist()
        return starts

    def segment(self, code: int) -> str:
        """The labeled segment of value ``code``: ``"name: value\\n"``."""
        field = bisect_right(self._starts, code) - 1
        return self.labels[field] + self.values[code] + "\n"

    def __len__(self) -> int:
        return int(self.ids.size)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> Requests: ...

    def __getitem__(self, index: int | slice) -> Request | Requests:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        i = position(index, len(self), "request")
        return self._request(i, self.prompt(i))

    def __iter__(self) -> Iterator[Request]:
        n = len(self)
        for start in range(0, n, _CHUNK):
            stop = min(start + _CHUNK, n)
            yield from map(
                tuple.__new__,
                repeat(Request),
                zip(
                    self.ids[start:stop].tolist(),
                    self.rows[start:stop].tolist(),
                    self.prompts(start, stop),
                    repeat(self.system),
                    repeat(self.max_tokens),
                    repeat(self.temperature),
                    repeat(self.schema),
                    self.groups[start:stop].tolist(),
                    self.levels[start:stop],
                    repeat(self.logprobs),
                    repeat(self.rel),
                    repeat(self.rel_size),
                ),
            )

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Requests({len(self):,} requests, {self.codes.shape[0]} fields)"

    def _request(self, i: int, prompt: str) -> Request:
        return Request(
            int(self.ids[i]),
            int(self.rows[i]),
            prompt,
            self.system,
            self.max_tokens,
            self.temperature,
            self.schema,
            int(self.groups[i]),
            self.levels[i],
            self.logprobs,
            self.rel,
            self.rel_size,
        )

    def prompt(self, i: int) -> str:
        """Request ``i``'s prompt (a position, ``0 <= i < len(self)``)."""
        tail = "" if self.tails is None else self.tails[i]
        return self.head + "".join(map(self.segment, self.codes[:, i].tolist())) + tail

    def prompts(self, start: int = 0, stop: int | None = None, *, head: bool = True) -> list[str]:
        """The prompts of requests ``start .. stop - 1``, rendered together.

        ``head=False`` leaves out what every prompt starts with (:attr:`head`).
        """
        stop = len(self) if stop is None else min(stop, len(self))
        count = max(0, stop - start)
        label = self.labels.__getitem__
        parts: list[Iterable[str]] = []
        for row in self.codes[:, start:stop]:
            fields = np.searchsorted(self.starts, row, side="right") - 1
            values = self._take(row, fields)
            if count and fields.min() == fields.max():  # one field at this depth (one order)
                parts += [repeat(label(int(fields[0]))), values, repeat("\n")]
            else:
                parts += [map(label, fields.tolist()), values, repeat("\n")]
        tails = repeat("") if self.tails is None else self.tails[start:stop]
        heads = repeat(self.head if head else "", count)
        return list(map("".join, zip(heads, *parts, tails, strict=False)))

    def _take(self, codes: NDArray[np.integer[Any]], fields: NDArray[np.intp]) -> list[str]:
        """The values ``codes`` (of ``fields``) as strings, a field's at once where joined."""
        if isinstance(self.values, Joined):
            return self.values.take(codes, fields)
        return list(map(self.values.__getitem__, codes.tolist()))

    def prompt_lengths(self) -> IntArray:
        """Characters of each prompt, from the segments' lengths (nothing rendered)."""
        total = np.full(len(self), len(self.head), dtype=np.int64)
        for row in self.codes:
            total += self.lengths[row]
        if self.tails is not None:
            total += np.fromiter(map(len, self.tails), np.int64, len(self))
        return total

    def prompt_bytes(self) -> IntArray:
        """UTF-8 bytes of each prompt, each distinct value encoded once (nothing rendered)."""
        per = byte_lengths(self.values) + 1
        labels = np.fromiter(map(utf8_len, self.labels), np.int64, len(self.labels))
        per += np.repeat(labels, np.diff(np.append(self.starts, len(self.values))))
        total = np.full(len(self), utf8_len(self.head), dtype=np.int64)
        for row in self.codes:
            total += per[row]
        if self.tails is not None:
            total += np.fromiter(map(utf8_len, self.tails), np.int64, len(self))
        return total

    def take(self, positions: Sequence[int] | NDArray[np.integer[Any]]) -> Requests:
        """The requests at ``positions`` (of this sequence), in that order, ids kept."""
        at = np.asarray(positions, dtype=np.intp)
        listed = at.tolist()
        return dataclasses.replace(
            self,
            codes=self.codes[:, at],
            tails=None if self.tails is None else tuple(map(self.tails.__getitem__, listed)),
            ids=self.ids[at],
            rows=self.rows[at],
            groups=self.groups[at],
            levels=tuple(map(self.levels.__getitem__, listed)),
        )

    def shipped(self) -> Requests:
        """These requests alone, to send to another process: ids and rows ``0 .. n - 1``.

        Only the values they use are kept (a shard of a large plan does not
        carry the others); prompts, groups and prefixes are unchanged.

        Examples
        --------
        >>> import numpy as np
        >>> rs = Requests.build("", ("a: ",), [("x", "y", "z")], np.array([[0, 1, 2]]),
        ...                     rows=np.array([5, 6, 7]), groups=np.array([0, 1, 2]))
        >>> part = rs.take([2, 0]).shipped()
        >>> list(part.values), [(r.id, r.row, r.prompt) for r in part]
        (['x', 'z'], [(0, 0, 'a: z\\n'), (1, 1, 'a: x\\n')])
        """
        used, inverse = np.unique(self.codes, return_inverse=True)
        fields = np.searchsorted(self.starts, used, side="right") - 1
        n = len(self)
        if isinstance(self.values, Joined):
            values: Sequence[str] = self.values.select(used)
        else:
            values = tuple(map(self.values.__getitem__, used.tolist()))
        return dataclasses.replace(
            self,
            values=values,
            starts=np.searchsorted(fields, np.arange(len(self.labels))).astype(np.int64),
            lengths=self.lengths[used],
            codes=inverse.reshape(self.codes.shape).astype(self.codes.dtype),
            ids=np.arange(n, dtype=np.int64),
            rows=np.arange(n, dtype=np.int64),
        )

    def group_bounds(self) -> list[tuple[int, int]]:
        """Runs of consecutive requests with the same prefix group, as ``(start, stop)``.

        Examples
        --------
        >>> import numpy as np
        >>> rs = Requests.build("", ("a: ",), [("x",)], np.zeros((1, 4), dtype=np.int64),
        ...                     rows=np.arange(4), groups=np.array([4, 4, 1, 4]))
        >>> rs.group_bounds()
        [(0, 2), (2, 3), (3, 4)]
        """
        n = len(self)
        if not n:
            return []
        starts = [0, *(np.flatnonzero(self.groups[1:] != self.groups[:-1]) + 1).tolist()]
        return list(zip(starts, [*starts[1:], n], strict=True))


def utf8_len(text: str) -> int:
    """UTF-8 bytes of ``text`` (a lone surrogate as its three bytes), ASCII counted in C.

    Examples
    --------
    >>> utf8_len("abc"), utf8_len("café")
    (3, 5)
    """
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def byte_lengths(values: Sequence[str]) -> IntArray:
    """UTF-8 bytes of each of ``values``: from Arrow's offsets, else by :func:`utf8_len`.

    Examples
    --------
    >>> byte_lengths(("abc", "caf\u00e9")).tolist()
    [3, 5]
    """
    if isinstance(values, Joined | ArrowValues):
        return values.byte_lengths()
    return np.fromiter(map(utf8_len, values), np.int64, len(values))


def with_options(requests: Sequence[Request], **options: Any) -> Sequence[Request]:
    """``requests`` with the shared values ``options`` set (``logprobs``, ``rel``, ...).

    Examples
    --------
    >>> rs = [Request(0, 0, "p", None, 8, 0.0, None, 0)]
    >>> with_options(rs, logprobs=3)[0].logprobs
    3
    """
    if isinstance(requests, Requests):
        return dataclasses.replace(requests, **options)
    return tuple(r._replace(**options) for r in requests)


def subset(requests: Sequence[Request], positions: Sequence[int]) -> Sequence[Request]:
    """The requests at ``positions`` of ``requests``, in that order (ids kept).

    Examples
    --------
    >>> rs = [Request(i, i, f"p{i}", None, 8, 0.0, None, 0) for i in range(3)]
    >>> [r.id for r in subset(rs, [2, 0])]
    [2, 0]
    """
    if isinstance(requests, Requests):
        return requests.take(positions)
    return tuple(requests[i] for i in positions)


def prompts_of(requests: Sequence[Request], start: int = 0, stop: int | None = None) -> list[str]:
    """The prompts of ``requests[start:stop]`` (rendered together where they are columns).

    Examples
    --------
    >>> prompts_of([Request(0, 0, "p", None, 8, 0.0, None, 0)])
    ['p']
    """
    if isinstance(requests, Requests):
        return requests.prompts(start, stop)
    return [r.prompt for r in requests[start:stop]]


def chars_of(requests: Sequence[Request]) -> IntArray:
    """Characters of each request's prompt.

    Examples
    --------
    >>> chars_of([Request(0, 0, "abc", None, 8, 0.0, None, 0)]).tolist()
    [3]
    """
    if isinstance(requests, Requests):
        return requests.prompt_lengths()
    return np.fromiter((len(r.prompt) for r in requests), np.int64, len(requests))


def rows_of(requests: Sequence[Request]) -> IntArray:
    """The row of the caller's frame each request answers.

    Examples
    --------
    >>> rows_of([Request(0, 5, "p", None, 8, 0.0, None, 0)]).tolist()
    [5]
    """
    if isinstance(requests, Requests):
        return requests.rows
    return np.fromiter((r.row for r in requests), np.int64, len(requests))


def group_ids_of(requests: Sequence[Request]) -> IntArray:
    """Each request's prefix group (nothing rendered).

    Examples
    --------
    >>> group_ids_of([Request(0, 5, "p", None, 8, 0.0, None, 3)]).tolist()
    [3]
    """
    if isinstance(requests, Requests):
        return requests.groups
    return np.fromiter((r.group for r in requests), np.int64, len(requests))


def bytes_of(requests: Sequence[Request]) -> IntArray:
    """UTF-8 bytes of each request's prompt.

    Examples
    --------
    >>> bytes_of([Request(0, 0, "café", None, 8, 0.0, None, 0)]).tolist()
    [5]
    """
    if isinstance(requests, Requests):
        return requests.prompt_bytes()
    return np.fromiter((utf8_len(r.prompt) for r in requests), np.int64, len(requests))


def ids_of(requests: Sequence[Request]) -> list[int]:
    """Each request's id, in order (nothing rendered).

    Examples
    --------
    >>> ids_of([Request(7, 5, "p", None, 8, 0.0, None, 0)])
    [7]
    """
    if isinstance(requests, Requests):
        ids: list[int] = requests.ids.tolist()
        return ids
    return [r.id for r in requests]
