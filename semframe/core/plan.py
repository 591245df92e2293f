"""relQueries and plans: what will be sent, in which order, before anything is sent.

A :class:`RelQuery` is one template applied to many rows. :func:`make_plan`
orders it (``semframe.reorder``) and renders each request following the prompt
layout of the design: the shared instructions first (task, output format,
examples), then the row's fields as labeled segments ``name: value`` in that
row's field order. The estimator prices a :class:`Plan` and the executor runs
the same plan, so the two cannot disagree about what is sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from itertools import repeat
from typing import Any

import numpy as np

from semframe._version import __version__
from semframe.core.capacity import Capacity
from semframe.core.display import html_table, pyplot
from semframe.core.ordering import Ordering
from semframe.core.parse import OutputSpec
from semframe.core.requests import Requests, chars_of
from semframe.core.table import MISSING, Coded, Codes, Table, render_value
from semframe.core.template import Template
from semframe.core.wire import Request
from semframe.errors import InputError, plural


@dataclass(frozen=True)
class RelQuery:
    """One template applied to every row of a table.

    Attributes
    ----------
    op : str
        The operator that built it (``"map"``, ``"filter"``).
    template : Template
        The parsed template; ``template.fields`` are the columns sent.
    table : Table
        The rendered values of exactly those columns.
    output : OutputSpec
        Answer format (schema for constrained decoding, parser).
    system : str or None
        Optional system message.
    examples : tuple of mapping
        Few-shot examples: each maps every template field and ``"answer"`` to a
        value (checked by :func:`check_examples`).
    max_tokens : int
        Output token limit per request.
    temperature : float
        Sampling temperature.
    logprobs : int
        Top alternatives per answer token to ask for (0: no logprobs).
    restate : bool
        Ask the template's question again after the row's fields, short values
        inline (:meth:`Template.restated`); the instructions stay first,
        shared and cached, and name the fields in words (``the review``, not
        ``[review]``). A small model answers what it read last: the
        row-by-row operators set it on backends that declare
        ``Capabilities.restate``, and ``filter`` and ``classify`` wherever
        they decide by calibrated probabilities.
    """

    op: str
    template: Template
    table: Table
    output: OutputSpec
    system: str | None = None
    examples: tuple[Mapping[str, object], ...] = ()
    max_tokens: int = 256
    temperature: float = 0.0
    logprobs: int = 0
    restate: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        """The columns each prompt carries."""
        return self.template.fields

    @functools.cached_property
    def instructions(self) -> str:
        """The shared instruction block (:func:`render_instructions`), rendered once."""
        return render_instructions(self)


def _assumed(capacity: Capacity | None) -> str:
    """What :meth:`Plan.explain` says of the cache a plan was made for."""
    if capacity is None:
        return "not known (planned without a backend)"
    return capacity.describe()


def render_instructions(rq: RelQuery) -> str:
    """The shared instruction block: task, output format, examples.

    Each example shows the template's fields as labeled lines, then its answer
    on a line ``answer: <value>``; the examples are checked first
    (:func:`check_examples`).

    Raises
    ------
    InputError
        An example that is not a mapping or lacks a key, or a field whose label
        reads as the examples' ``answer:`` line.

    Examples
    --------
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.parse import BOOL
    >>> rq = RelQuery("filter", parse_template("Is {review} positive?"),
    ...               Table.from_columns({"review": ["great"]}), BOOL,
    ...               examples=({"review": "awful", "answer": "no"},))
    >>> print(render_instructions(rq))
    Is [review] positive?
    Answer with a JSON object: {"answer": "yes"} or {"answer": "no"}.
    <BLANKLINE>
    Example:
    review: awful
    answer: no
    """
    check_examples(rq)
    lines = [rq.template.instruction(brackets=not rq.restate).strip()]
    if rq.output.instruction:
        lines.append(rq.output.instruction)
    text = "\n".join(lines)
    for example in rq.examples:
        segs = "".join(f"{f}: {render_value(example[f])}\n" for f in rq.fields)
        text += f"\n\nExample:\n{segs}answer: {render_value(example['answer'])}"
    return text


def check_examples(rq: RelQuery) -> None:
    """Fail unless every example can be rendered unambiguously.

    Each example must be a mapping with a key for every template field and
    ``"answer"``. With examples, no field may be labeled so that its line reads
    as an example's ``answer:`` line: a field named ``answer`` (in any case,
    with surrounding spaces, in compatibility forms such as fullwidth letters,
    with invisible characters, or followed by a colon, as in ``answer: final``).
    The model would take that field's value for an answer to imitate, and one
    ``"answer"`` key could not hold both.

    Without examples a field named ``answer`` is allowed: the only ``answer:``
    line of the prompt is then the field itself, which the instruction names as
    ``[answer]``; the output format's ``{"answer": ...}`` is a JSON key, not a
    labeled line. Refusing it would refuse every question/answer data set.

    Raises
    ------
    InputError
        Naming the example or the field, and what would be valid.

    Examples
    --------
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.parse import BOOL
    >>> rq = RelQuery("filter", parse_template("Is {answer} right?"),
    ...               Table.from_columns({"answer": ["4"]}), BOOL)
    >>> check_examples(rq)  # no examples: allowed
    >>> check_examples(RelQuery(rq.op, rq.template, rq.table, BOOL,
    ...                         examples=({"answer": "yes"},)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.InputError: the template's field 'answer' is labeled 'answer: ...', ...
    """
    if not rq.examples:
        return
    for number, example in enumerate(rq.examples, 1):
        if not isinstance(example, Mapping):
            kind = type(example).__name__  # type: ignore[unreachable]
            hint = (
                " (a single dict passed as examples= is read as its keys: wrap it in a list, "
                "examples=[{...}])"
                if isinstance(example, str)
                else ""
            )
            msg = (
                f"example {number} is {_article(kind)} {kind} ({_short(repr(example), 60)}); "
                f"examples must be a list of mappings, each with the keys "
                f"{[*rq.fields, 'answer']!r}{hint}."
            )
            raise InputError(msg)
    for name in rq.fields:
        if _reads_as_answer(name):
            msg = (
                f"the template's field {name!r} is labeled {name + ': ...'!r}, which reads as the "
                "examples' 'answer: ...' line, so the model would take its value for an answer. "
                f"Rename the column, e.g. df = df.rename(columns={{{name!r}: 'proposed_answer'}}), "
                "and name the new column in the template and the examples; or pass no examples."
            )
            raise InputError(msg)
    want = [*rq.fields, "answer"]
    for example in rq.examples:
        lacks = [f for f in want if f not in example]
        if lacks:
            msg = (
                f"example {_short(repr(dict(example)), 200)} lacks {lacks!r}; "
                f"each example needs the keys {want!r}."
            )
            raise InputError(msg)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _reads_as_answer(name: str) -> bool:
    """Whether the line ``name: value`` reads as an ``answer: value`` line.

    Examples
    --------
    >>> [_reads_as_answer(n) for n in ["answer", " Answer", "answer: x", "answers", "the answer"]]
    [True, True, True, False, False]
    """
    text = unicodedata.normalize("NFKC", name)
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C").strip().casefold()
    if not text.startswith("answer"):
        return False
    rest = text[len("answer") :].lstrip()
    return not rest or rest.startswith(":")


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    """A run of consecutive requests whose prompts share leading fields.

    Attributes
    ----------
    start, stop : int
        Requests ``start <= id < stop`` (execution positions).
    """

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Plan:
    """Ordered, rendered requests of a relQuery: exactly what a run sends.

    Attributes
    ----------
    relquery : RelQuery
        What is asked.
    ordering : Ordering
        Execution order of rows and per-row field order.
    reorder : str
        The reordering method that produced ``ordering``.
    instructions : str
        The shared instruction block every prompt starts with.
    requests : sequence of Request
        In execution order; ``requests[i].row == ordering.rows[i]``. A planned
        relQuery holds them as columns (:class:`~semframe.core.requests.Requests`),
        each prompt rendered when it is read; a plan derived from requests
        already made (a shard, a re-plan) may hold a tuple.
    groups : tuple of PrefixGroup
        Prefix groups in execution order (consecutive requests sharing their
        first field).
    shared_chars : tuple of int
        For each request, how many leading prompt characters it shares with the
        previous request, counted in whole labeled segments (what a prefix cache
        holding only the previous prompt would serve; partial values do not count).
    capacity : Capacity or None
        The prefix cache and concurrency the plan is made for (the backend's
        cost model declares it; ``None``: planned without a backend). It
        changes no request, so it is not part of the plan's fingerprint.
    """

    relquery: RelQuery
    ordering: Ordering
    reorder: str
    instructions: str
    requests: Sequence[Request]
    groups: tuple[PrefixGroup, ...]
    shared_chars: tuple[int, ...] = field(repr=False)
    capacity: Capacity | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_chars(self) -> int:
        """Total characters of all prompts."""
        return int(chars_of(self.requests).sum())

    @property
    def expected_hit_rate(self) -> float:
        """Share of prompt characters equal to the previous prompt's prefix."""
        total = self.prompt_chars
        return sum(self.shared_chars) / total if total else 0.0

    def group_key(self, group: PrefixGroup) -> tuple[tuple[str, str], ...]:
        """The leading (field, value) pairs every request of ``group`` starts with."""
        return _key_of(self.relquery, self.ordering, group.start, group.stop)

    def restore(self, values: Sequence[Any]) -> list[Any]:
        """Values aligned with ``requests`` -> values in the caller's row order."""
        return self.ordering.restore(values)

    def _summary(self) -> list[tuple[str, str]]:
        """The plan in a few (what, value) lines: what :meth:`explain` and the table show."""
        rq = self.relquery
        sizes = [len(g) for g in self.groups]
        groups = f"{len(self.groups):,}" + (
            f" (largest {max(sizes):,}, mean {sum(sizes) / len(sizes):.1f})" if sizes else ""
        )
        return [
            ("reorder", self.reorder),
            ("prefix groups", groups),
            ("prompt characters", f"{self.prompt_chars:,}"),
            ("expected prefix reuse (previous prompt)", f"{self.expected_hit_rate:.1%}"),
            ("cache assumed", _assumed(self.capacity)),
            (
                "output",
                f"{rq.output.kind}, max_tokens={rq.max_tokens}, temperature={rq.temperature}",
            ),
        ]

    def _title(self) -> str:
        rq = self.relquery
        return f"Plan: {rq.op} over {plural(len(self.requests), 'row')}, fields {list(rq.fields)}"

    def _group_line(self, g: PrefixGroup, width: int = 30) -> str:
        key = self.group_key(g)
        return ", ".join(f"{c}={_short(v, width)!r}" for c, v in key) or "(none)"

    def explain(self, n: int = 3) -> str:
        """A readable account of what will be sent, and in which order.

        Parameters
        ----------
        n : int
            How many requests and groups to show in full.

        Examples
        --------
        >>> from semframe.core.template import parse_template
        >>> from semframe.core.parse import TEXT
        >>> t = Table.from_columns({"movie": ["Alien"], "review": ["tense"]})
        >>> rq = RelQuery("map", parse_template("Summarize {review} of {movie}."), t, TEXT)
        >>> plan = make_plan(rq, Ordering.identity(1, ("movie", "review")), "none")
        >>> print(plan.explain().splitlines()[0])
        Plan: map over 1 row, fields ['review', 'movie']
        """
        summary = dict(self._summary())
        rq = self.relquery
        lines = [
            self._title(),
            f"  reorder: {self.reorder}; prefix groups: {summary['prefix groups']}",
            f"  prompt characters: {summary['prompt characters']}; expected prefix reuse "
            f"(previous prompt): {summary['expected prefix reuse (previous prompt)']}",
            f"  cache assumed: {summary['cache assumed']}",
            f"  output: {rq.output.kind}, max_tokens={rq.max_tokens}, temperature={rq.temperature}",
            f"  row order (first {min(n * 4, len(self.requests))}): "
            f"{self.ordering.rows[: n * 4].tolist()}",
        ]
        used = np.unique(self.ordering.order_of).size  # the orders a row takes
        lines.append(
            f"  field orders: {used} distinct; first: "
            f"{list(self.ordering.fields[0]) if len(self.ordering) else []}"
        )
        lines.append("  groups:")
        for g in self.groups[:n]:
            lines.append(f"    requests {g.start}-{g.stop - 1} ({len(g)}): {self._group_line(g)}")
        if len(self.groups) > n:
            lines.append(f"    ... {plural(len(self.groups) - n, 'more group')}")
        lines.append("  shared instructions:")
        lines.extend("    | " + line for line in self.instructions.splitlines())
        for req in self.requests[:n]:
            lines.append(f"  request {req.id} (row {req.row}, group {req.group}):")
            body = req.prompt[len(self.instructions) :].strip("\n")
            lines.extend("    | " + _short(line, 100) for line in body.splitlines())
        if len(self.requests) > n:
            lines.append(f"  ... {plural(len(self.requests) - n, 'more request')}")
        return "\n".join(lines)

    def _repr_html_(self, n: int = 10) -> str:
        """The plan as a notebook shows it: a summary, the first groups, the prompts."""
        groups = [
            (f"{g.start:,}-{g.stop - 1:,}", f"{len(g):,}", self._group_line(g, 60))
            for g in self.groups[:n]
        ]
        more = len(self.groups) - len(groups)
        first = self.requests[0].prompt[len(self.instructions) :].strip("\n") if self else ""
        return (
            f"<div><b>{escape(self._title())}</b>"
            + html_table(self._summary())
            + "<details><summary>prefix groups"
            + (f" (first {len(groups):,} of {len(self.groups):,})" if more > 0 else "")
            + "</summary>"
            + html_table(
                groups, head=("requests", "size", "shared fields (leading values)"), left=0
            )
            + "</details>"
            + f"<details><summary>shared instructions</summary><pre>"
            f"{escape(self.instructions)}</pre></details>"
            + (
                f"<details><summary>first request's fields</summary><pre>{escape(first)}"
                "</pre></details>"
                if self
                else ""
            )
            + "</div>"
        )

    def plot(self, ax: Any = None) -> Any:
        """Prefix groups in execution order: their sizes, and the prefix each one shares.

        Bars: requests per group. Line (right axis): characters every request
        of the group shares at its start (the instructions, and the group's
        leading field values when it has more than one request), what a prefix
        cache can serve to its followers.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw (default: a new figure).

        Returns
        -------
        matplotlib Axes
            The axes of the group sizes; the shared-prefix line is on its twin,
            the figure's last axes.

        Raises
        ------
        MissingDependencyError
            matplotlib is not installed (``pip install matplotlib``).

        Examples
        --------
        >>> from semframe.core.template import parse_template
        >>> from semframe.core.parse import TEXT
        >>> t = Table.from_columns({"movie": ["Alien", "Alien", "Heat"], "review": ["a", "b", "c"]})
        >>> rq = RelQuery("map", parse_template("Summarize {review} of {movie}."), t, TEXT)
        >>> plan = make_plan(rq, Ordering.identity(3, ("movie", "review")), "none")
        >>> ax = plan.plot()
        >>> ax.get_title()
        'map, reorder=none: 2 prefix groups over 3 requests'
        >>> import matplotlib.pyplot as plt; plt.close(ax.figure)
        """
        plt = pyplot("Plan.plot()")
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3.5))
        head = len(self.instructions) + 2 if self.requests else 0
        sizes = [len(g) for g in self.groups]
        shared = [  # a group of one shares only the instructions with the others
            head + sum(len(f"{c}: {v}\n") for c, v in self.group_key(g)) * (len(g) > 1)
            for g in self.groups
        ]
        edges = range(len(sizes) + 1)
        ax.stairs(sizes, edges, fill=True, alpha=0.6, label="requests in the group")
        ax.set_xlabel("prefix group (execution order)")
        ax.set_ylabel("requests")
        ax.set_title(
            f"{self.relquery.op}, reorder={self.reorder}: "
            f"{plural(len(self.groups), 'prefix group')} over {plural(len(self), 'request')}"
        )
        twin = ax.twinx()
        twin.stairs(shared, edges, baseline=None, color="C1", label="shared prefix (characters)")
        twin.set_ylabel("shared prefix (characters)")
        twin.set_ylim(bottom=0)
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize="small")
        return ax

    def __repr__(self) -> str:
        return (
            f"Plan(op={self.relquery.op!r}, requests={len(self.requests)}, "
            f"groups={len(self.groups)}, reorder={self.reorder!r}, "
            f"expected_hit_rate={self.expected_hit_rate:.3f})"
        )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def make_plan(rq: RelQuery, ordering: Ordering, reorder: str) -> Plan:
    """Render ``rq``'s requests in ``ordering``.

    Examples
    --------
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.parse import TEXT
    >>> t = Table.from_columns({"movie": ["Alien", "Alien"], "review": ["tense", "scary"]})
    >>> rq = RelQuery("map", parse_template("Summarize {review} of {movie}."), t, TEXT)
    >>> plan = make_plan(rq, Ordering.identity(2, ("movie", "review")), "none")
    >>> print(plan.requests[1].prompt)
    Summarize [review] of [movie].
    <BLANKLINE>
    movie: Alien
    review: scary
    <BLANKLINE>
    >>> [(g.start, g.stop) for g in plan.groups], plan.group_key(plan.groups[0])
    ([(0, 2)], (('movie', 'Alien'),))

    Each request knows its cacheable prefixes and how many requests share them:

    >>> [(plan.requests[1].prompt[:end].strip().splitlines()[-1], n)
    ...  for end, n in plan.requests[1].prefix]
    [('Summarize [review] of [movie].', 2), ('movie: Alien', 2)]
    """
    with without_gc():
        return _make_plan(rq, ordering, reorder)


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while many objects that hold no cycles are built.

    Building a request per row allocates enough containers to start a
    collection every few hundred rows, each one scanning every object built
    so far: a third of the planning time of a 300,000-row relQuery. Nothing
    built here can form a cycle; the collector runs again afterwards (if it
    was enabled).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _make_plan(rq: RelQuery, ordering: Ordering, reorder: str) -> Plan:
    ordering.validate(rq.table.n_rows, rq.fields)
    instructions = rq.instructions
    check_sendable(rq, instructions)
    head = instructions + "\n\n"
    n, k = len(ordering), len(rq.fields)
    if n == 0:
        return Plan(rq, ordering, reorder, instructions, (), (), ())
    rows = ordering.rows
    # Each column factorized once; every column's distinct values in one sequence, a
    # column's after the one before it.
    columns = [_Column.of(f, rq.table.coded(f)) for f in rq.fields]
    sizes = [len(c.values) for c in columns]
    offsets = np.zeros(k, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    position = {f: j for j, f in enumerate(rq.fields)}
    orders, order_of = ordering.orders, ordering.order_of
    # Per field depth and execution position: the column, and the value (into all values).
    col = np.empty((k, n), dtype=np.int16 if k < 2**15 else np.int64)
    code = np.empty((k, n), dtype=np.int32 if sum(sizes) < 2**31 else np.int64)
    for o, order in enumerate(orders):
        at = np.flatnonzero(order_of == o) if len(orders) > 1 else slice(None)
        taken = rows[at]
        for depth, name in enumerate(order):
            j = position[name]
            col[depth, at] = j
            code[depth, at] = columns[j].codes[taken] + offsets[j]
    missing = np.array(
        [offsets[j] + c.missing if c.missing >= 0 else -1 for j, c in enumerate(columns)],
        dtype=np.int64,
    )
    requests = Requests.build(
        head,
        [c.label for c in columns],
        [c.values for c in columns],
        code,
        rows=rows,
        groups=np.zeros(n, dtype=np.int64),
        system=rq.system,
        max_tokens=rq.max_tokens,
        temperature=rq.temperature,
        schema=rq.output.schema,
        logprobs=rq.logprobs,
    )
    length = requests.lengths[code]  # of each request's segment at each depth
    equal, shared = _shared(head, requests.segment, columns, col, code, length, orders, order_of)
    # A prefix group starts where the first segment differs from the previous request's,
    # or holds a missing value.
    if k:
        first = equal >= 1
        first &= code[0] != missing[col[0]]
        starts = ~first
    else:
        starts = np.ones(n, dtype=bool)
    starts[0] = True
    group_of = np.cumsum(starts) - 1
    levels = _levels(equal, length, len(head))
    del col, length
    tails = tuple(row_tails(rq, rows)) if rq.restate else None
    requests = dataclasses.replace(requests, groups=group_of, levels=tuple(levels), tails=tails)
    bounds = np.flatnonzero(starts).tolist()
    groups = [PrefixGroup(a, b) for a, b in zip(bounds, [*bounds[1:], n], strict=True)]
    return Plan(
        rq, ordering, reorder, instructions, requests, tuple(groups), tuple(shared.tolist())
    )


@dataclass(frozen=True, slots=True)
class _Column:
    """One field's values factorized: what :func:`make_plan` renders and compares."""

    label: str  # ``"{name}: "``
    values: Sequence[str]  # the distinct values, first seen first
    codes: Codes  # per table row, into ``values``
    missing: int  # the code of a missing value, -1 when none is

    @classmethod
    def of(cls, name: str, coded: Coded) -> _Column:
        values, codes = coded
        missing = values.index(MISSING) if MISSING in values else -1
        return cls(f"{name}: ", values, codes, missing)


def groups_of(requests: Sequence[Request]) -> list[PrefixGroup]:
    """Prefix groups of ``requests``: runs of consecutive requests with the same ``group``.

    Examples
    --------
    >>> from semframe.core.wire import Request
    >>> rs = [Request(i, i, "", None, 8, 0.0, None, g) for i, g in enumerate([4, 4, 1, 4])]
    >>> [(g.start, g.stop) for g in groups_of(rs)]
    [(0, 2), (2, 3), (3, 4)]
    """
    if isinstance(requests, Requests):  # columns: nothing rendered
        return [PrefixGroup(a, b) for a, b in requests.group_bounds()]
    groups = []
    start = 0
    for k in range(1, len(requests) + 1):
        if k == len(requests) or requests[k].group != requests[k - 1].group:
            groups.append(PrefixGroup(start, k))
            start = k
    return groups


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b``.

    Binary search over slice comparisons: the comparisons run in C, so this is
    fast for long prompts.

    Examples
    --------
    >>> common_prefix_len("movie: Alien\\nreview: a", "movie: Alien\\nreview: b")
    21
    >>> common_prefix_len("", "x"), common_prefix_len("ab", "ab")
    (0, 2)
    """
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared(  # noqa: PLR0917
    head: str,
    segment: Callable[[int], str],
    columns: Sequence[_Column],
    col: np.ndarray[Any, np.dtype[np.signedinteger[Any]]],
    code: np.ndarray[Any, np.dtype[np.signedinteger[Any]]],
    length: np.ndarray[Any, np.dtype[np.int64]],
    orders: Sequence[tuple[str, ...]],
    order_of: Codes,
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """Per request: whole leading segments equal to the previous request's, and shared chars.

    ``code[d, i]`` is request ``i``'s value at depth ``d`` (into every column's
    distinct values, each once, so equal codes are equal segments of one
    field; ``segment`` renders one); ``col[d, i]`` its column. Shared characters are
    those of the instructions, the equal segments and the label of the first
    differing segment when the previous request's segment there starts with
    it (the same field, with another value). Segments of different fields
    (rows whose field orders differ) are compared as text.
    """
    k, n = code.shape
    equal = np.zeros(n, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    if n < 2:
        return equal, shared
    same_col = col[:, 1:] == col[:, :-1]
    eq = code[:, 1:] == code[:, :-1]
    cross = np.argwhere(~same_col)  # (depth, position - 1): other fields, compared as text
    for depth, prev in cross.tolist():
        eq[depth, prev] = segment(code[depth, prev]) == segment(code[depth, prev + 1])
    equal[1:] = np.cumprod(eq, axis=0).sum(axis=0)
    ends = np.zeros((k + 1, n), dtype=np.int64)
    np.cumsum(length, axis=0, out=ends[1:])
    shared[1:] = len(head) + ends[equal[1:], np.arange(1, n)]
    # The label of the first differing segment, when the previous one starts with it.
    differs = np.flatnonzero(equal[1:] < k) + 1
    if differs.size:
        at = equal[differs]
        same = col[at, differs] == col[at, differs - 1]
        label_len = np.array([len(c.label) for c in columns], dtype=np.int64)
        shared[differs[same]] += label_len[col[at[same], differs[same]]]
        for pos, d in zip(differs[~same].tolist(), at[~same].tolist(), strict=True):
            label = orders[int(order_of[pos])][d] + ": "
            if segment(code[d, pos - 1]).startswith(label):
                shared[pos] += len(label)
    return equal, shared


def _levels(
    equal: np.ndarray[Any, np.dtype[np.int64]],
    length: np.ndarray[Any, np.dtype[np.int64]],
    head: int,
) -> list[tuple[tuple[int, int], ...]]:
    """Per request: (end, shared_by) for the instructions and each shared field depth.

    ``equal[i]`` is how many whole leading segments request ``i`` shares with
    request ``i - 1``; ``length[d, i]`` is the length of request ``i``'s
    segment at depth ``d``. At depth ``d`` a run of consecutive requests with
    ``equal >= d`` between neighbours shares its first ``d`` segments; each of
    its members gets ``(end of its first d segments, run length)``. A member
    at depth ``d`` is one at every depth above it too.
    """
    n = len(equal)
    base = ((head, n),)
    ends = head + np.cumsum(length, axis=0)
    sizes: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    runs: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    member_to = np.zeros(n, dtype=np.int64)  # the deepest depth each request is a member at
    for depth in range(1, int(equal.max(initial=0)) + 1):
        run = np.cumsum(equal < depth) - 1
        size = np.bincount(run)[run]
        member = size >= 2
        if not member.any():
            break
        member_to[member] = depth
        sizes.append(size)
        runs.append(run)
    levels: list[tuple[tuple[int, int], ...]] = [base] * n
    for deepest in range(1, len(sizes) + 1):
        at = np.flatnonzero(member_to == deepest)
        if not at.size:
            continue
        # The members of one run at their deepest depth have the same levels: built
        # once per run and shared (runs are numbered in request order).
        run_at = runs[deepest - 1][at]
        new_run = np.ones(at.size, dtype=bool)
        new_run[1:] = run_at[1:] != run_at[:-1]
        lead = at[new_run]
        found = [
            zip(ends[d][lead].tolist(), sizes[d][lead].tolist(), strict=True)
            for d in range(deepest)
        ]
        built = list(zip(repeat(base[0]), *found))
        which = (np.cumsum(new_run) - 1).tolist()
        for i, level in zip(at.tolist(), map(built.__getitem__, which), strict=True):
            levels[i] = level
    return levels


PLAN_FORMAT = 2
"""Version of the prompt layout; part of :func:`fingerprint`. Bump it with any change to
ordering or rendering that changes what a plan sends."""


def row_tails(rq: RelQuery, rows: Sequence[int] | np.ndarray) -> Sequence[str]:
    """What follows the fields of each of ``rows`` in its prompt: ``""``, or the restated question.

    Fields are read factorized (:meth:`~semframe.core.table.Table.coded`),
    each distinct value looked at once.

    Examples
    --------
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.parse import TEXT
    >>> t = Table.from_columns({"movie": ["Alien", "Heat"]})
    >>> rq = RelQuery("map", parse_template("Is {movie} good?"), t, TEXT, restate=True)
    >>> row_tails(rq, [1])
    ['\\nIs Heat good?\\n']
    """
    if not rq.restate:
        return [""] * len(rows)
    at = np.asarray(rows, dtype=np.intp)
    by_field = {}
    for name in rq.template.fields:
        values, codes = rq.table.coded(name)
        by_field[name] = (values, codes[at])
    asked = rq.template.restated_coded(by_field, len(at))
    tails = {text: "\n" + text.strip() + "\n" for text in dict.fromkeys(asked)}
    return list(map(tails.__getitem__, asked))


def fingerprint(rq: RelQuery, reorder: str) -> str:
    """A digest of everything that decides the requests of ``rq`` planned with ``reorder``.

    Ordering and rendering are deterministic, so two relQueries with the same
    fingerprint plan the same requests (same prompts, decoding parameters and
    order). The result cache keys a whole call by it, to serve a re-run
    without ordering or rendering anything (see :mod:`semframe.cache.store`). It
    covers the semframe version, :data:`PLAN_FORMAT`, the method, the rendered
    instructions, every cell, the system message, output schema and decoding
    parameters; not the parser (answers are parsed again when served).

    Examples
    --------
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.parse import TEXT
    >>> t = Table.from_columns({"a": ["x", "y"]})
    >>> rq = RelQuery("map", parse_template("Echo {a}"), t, TEXT)
    >>> key = fingerprint(rq, "ggr")
    >>> key == fingerprint(rq, "ggr"), key == fingerprint(rq, "none")
    (True, False)
    >>> u = Table.from_columns({"a": ["xy", ""]})  # the same characters, split differently
    >>> key == fingerprint(RelQuery("map", rq.template, u, TEXT), "ggr")
    False
    """
    schema = rq.output.schema
    head = [
        PLAN_FORMAT,
        __version__,
        rq.op,
        rq.output.kind,
        reorder,
        list(rq.fields),
        rq.instructions,
        rq.system,
        None if schema is None else json.dumps(schema, sort_keys=True),
        rq.max_tokens,
        repr(float(rq.temperature)),
        rq.logprobs,
        rq.table.n_rows,
        *(["restate"] if rq.restate else []),
    ]
    digest = hashlib.sha256(json.dumps(head, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    for name in rq.fields:
        # Each cell's length in UTF-8 bytes, then the cells' text: read from an Arrow
        # column's own buffers where it has them (Table.utf8), nothing joined or encoded.
        lengths, parts = rq.table.utf8(name)
        digest.update(b"\x00" + lengths.astype("<i8", copy=False).tobytes())
        for part in parts:
            digest.update(part)
    return digest.hexdigest()


def validate(rq: RelQuery) -> None:
    """Fail before anything is sent when ``rq`` cannot be rendered or sent.

    Renders the instructions, which checks the examples (:func:`check_examples`:
    each a mapping with every field and ``"answer"``, and no field labeled like
    their ``answer:`` line), and checks that all text is valid Unicode
    (:func:`check_sendable`).

    Raises
    ------
    InputError
        Naming what is wrong and what would be valid.
    """
    check_sendable(rq, rq.instructions)


def check_sendable(rq: RelQuery, instructions: str) -> None:
    """Fail before sending when some text is not valid Unicode (a lone surrogate).

    Requests travel as UTF-8, which cannot carry a lone surrogate (text decoded
    with ``errors="surrogateescape"`` holds them, for instance).
    """
    hint = ".str.encode('utf-8', 'replace').str.decode('utf-8')"
    for name in rq.fields:
        if rq.table.arrow(name) is not None:  # Arrow strings are UTF-8: no lone surrogate
            continue
        cells = rq.table.cells[name]
        if all(map(str.isascii, cells)):  # ASCII holds no surrogate (a flag, no scan)
            continue
        try:
            "".join(cells).encode("utf-8")
        except UnicodeEncodeError:
            for row, text in enumerate(cells):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    msg = (
                        f"column {name!r}, row {row}: the text holds {text[exc.start]!r} at "
                        f"position {exc.start}, a lone surrogate, which is not valid Unicode "
                        f"and cannot be sent (requests are UTF-8). Replace it first, e.g. "
                        f"df[{name!r}] = df[{name!r}]{hint}"
                    )
                    raise InputError(msg) from None
    try:
        instructions.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = (
            f"the template or its examples hold {instructions[exc.start]!r}, a lone surrogate, "
            "which is not valid Unicode and cannot be sent (requests are UTF-8); remove it."
        )
        raise InputError(msg) from None


def _key_of(rq: RelQuery, ordering: Ordering, start: int, stop: int) -> tuple[tuple[str, str], ...]:
    cells = rq.table.cells
    fields = ordering.fields[start:stop]
    rows = ordering.rows[start:stop].tolist()
    key: list[tuple[str, str]] = []
    for depth, name in enumerate(fields[0]):
        column = cells[name]
        value = column[rows[0]]
        for order, row in zip(fields, rows, strict=True):
            if order[depth] != name or column[row] != value:
                return tuple(key)
        key.append((name, value))
    return tuple(key)
