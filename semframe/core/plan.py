"""relQueries and plans: what will be sent, in which order, before anything is sent.

A :class:`RelQuery` is one template applied to many rows. :func:`make_plan`
orders it (``semframe.reorder``) and renders each request following the prompt
layout of the design: the shared instructions first (task, output format,
examples), then the row's fields as labeled segments ``name: value`` in that
row's field order. The estimator prices a :class:`Plan` and the executor runs
the same plan, so the two cannot disagree about what is sent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from semframe._version import __version__
from semframe.core.display import html_table, pyplot
from semframe.core.ordering import Ordering
from semframe.core.parse import OutputSpec
from semframe.core.table import MISSING, Table, render_value
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
        Ask the template's question again after the row's fields (the
        instructions stay first, shared and cached): a small model answers
        what it read last. ``filter`` and ``classify`` set it where they
        decide by calibrated probabilities. The instructions then name the
        fields bare (``review``, not ``[review]``).
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
    requests : tuple of Request
        In execution order; ``requests[i].row == ordering.rows[i]``.
    groups : tuple of PrefixGroup
        Prefix groups in execution order (consecutive requests sharing their
        first field).
    shared_chars : tuple of int
        For each request, how many leading prompt characters it shares with the
        previous request, counted in whole labeled segments (what a prefix cache
        holding only the previous prompt would serve; partial values do not count).
    """

    relquery: RelQuery
    ordering: Ordering
    reorder: str
    instructions: str
    requests: tuple[Request, ...]
    groups: tuple[PrefixGroup, ...]
    shared_chars: tuple[int, ...] = field(repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_chars(self) -> int:
        """Total characters of all prompts."""
        return sum(len(r.prompt) for r in self.requests)

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
            f"  output: {rq.output.kind}, max_tokens={rq.max_tokens}, temperature={rq.temperature}",
            f"  row order (first {min(n * 4, len(self.requests))}): "
            f"{list(self.ordering.rows[: n * 4])}",
        ]
        distinct_orders = list(dict.fromkeys(self.ordering.fields))
        lines.append(
            f"  field orders: {len(distinct_orders)} distinct; first: "
            f"{list(distinct_orders[0]) if distinct_orders else []}"
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
    ordering.validate(rq.table.n_rows, rq.fields)
    instructions = rq.instructions
    check_sendable(rq, instructions)
    head = instructions + "\n\n"
    tail = "\n" + rq.template.instruction(brackets=False).strip() + "\n" if rq.restate else ""
    cells = rq.table.cells
    # Labeled segments, rendered column by column once.
    labels = {f: f"{f}: " for f in rq.fields}
    segments = {f: [f"{f}: {v}\n" for v in cells[f]] for f in rq.fields}
    missing = {f: {f"{f}: {MISSING}\n"} for f in rq.fields}
    system, schema = rq.system, rq.output.schema
    max_tokens, temperature = rq.max_tokens, rq.temperature
    rows_parts: list[list[str]] = []
    starts: list[int] = []
    shared: list[int] = []
    equal: list[int] = []  # whole leading segments equal to the previous request's
    group_of: list[int] = []
    prev: list[str] = []
    for pos, (row, order) in enumerate(zip(ordering.rows, ordering.fields, strict=True)):
        parts = [segments[f][row] for f in order]
        same = 0
        if pos == 0:
            shared.append(0)
        else:
            # Equal to the previous prompt: the instructions, whole equal segments, and
            # the label of the first differing segment when it is the same field.
            common = len(head)
            for a, b, name in zip(prev, parts, order, strict=False):
                if a != b:
                    if a.startswith(labels[name]):
                        common += len(labels[name])
                    break
                common += len(a)
                same += 1
            shared.append(common)
        equal.append(same)
        if pos == 0 or not parts or parts[0] != prev[0] or parts[0] in missing[order[0]]:
            starts.append(pos)
        group_of.append(len(starts) - 1)
        prev = parts
        rows_parts.append(parts)
    levels = _prefix_levels(equal, rows_parts, len(head))
    requests = [
        Request(
            pos,
            row,
            head + "".join(parts) + tail,
            system,
            max_tokens,
            temperature,
            schema,
            group_of[pos],
            levels[pos],
            rq.logprobs,
        )
        for pos, (row, parts) in enumerate(zip(ordering.rows, rows_parts, strict=True))
    ]
    bounds = zip(starts, [*starts[1:], len(requests)], strict=False)
    groups = [PrefixGroup(a, b) for a, b in bounds]
    return Plan(rq, ordering, reorder, instructions, tuple(requests), tuple(groups), tuple(shared))


PLAN_FORMAT = 1
"""Version of the prompt layout; part of :func:`fingerprint`. Bump it with any change to
ordering or rendering that changes what a plan sends."""


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
        cells = rq.table.cells[name]
        digest.update(b"\x00" + array("q", map(len, cells)).tobytes())
        digest.update("".join(cells).encode("utf-8", "surrogatepass"))
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
        cells = rq.table.cells[name]
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


def _prefix_levels(
    equal: Sequence[int], parts: Sequence[Sequence[str]], head: int
) -> list[tuple[tuple[int, int], ...]]:
    """Per request: (end, shared_by) for the instructions and each shared field depth.

    ``equal[i]`` is how many whole leading segments request ``i`` shares with
    request ``i - 1``. At depth ``d`` a run of consecutive requests with
    ``equal >= d`` between neighbours shares its first ``d`` segments; each of
    its members gets ``(end of its first d segments, run length)``.
    """
    n = len(equal)
    base = ((head, n),) if n else ()
    levels: list[tuple[tuple[int, int], ...]] = [base] * n
    extra: dict[int, list[tuple[int, int]]] = {}
    depth = 1
    deepest = max(equal, default=0)
    while depth <= deepest:
        i = 0
        while i < n:
            j = i + 1
            while j < n and equal[j] >= depth:
                j += 1
            if j - i >= 2:
                for m in range(i, j):
                    end = head + sum(len(s) for s in parts[m][:depth])
                    extra.setdefault(m, []).append((end, j - i))
            i = j
        depth += 1
    for m, found in extra.items():
        levels[m] = base + tuple(found)
    return levels


def _key_of(rq: RelQuery, ordering: Ordering, start: int, stop: int) -> tuple[tuple[str, str], ...]:
    cells = rq.table.cells
    first_order = ordering.fields[start]
    first_row = ordering.rows[start]
    key: list[tuple[str, str]] = []
    for depth, name in enumerate(first_order):
        value = cells[name][first_row]
        for pos in range(start + 1, stop):
            order = ordering.fields[pos]
            if order[depth] != name or cells[name][ordering.rows[pos]] != value:
                return tuple(key)
        key.append((name, value))
    return tuple(key)
