"""What runs cost: statistics of one relQuery run, of one operator call, and the run report.

:class:`RunStats` describes one relQuery run (``semframe.last_run()``),
:class:`OpStats` a whole operator call, all its relQueries (``semframe.last_op()``).
Both land in one :class:`Report`, held in a context variable: by default one
report for the process (what a notebook shows after any cell), and a fresh one
inside :func:`report_scope`, for code that runs operator calls side by side
(threads, tasks) and wants each one's own figures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from html import escape

from semframe.core.display import html_table
from semframe.core.wire import Usage
from semframe.errors import plural

__all__ = [
    "OpStats",
    "ReplicaStats",
    "Report",
    "RunStats",
    "last_op",
    "last_run",
    "record_op",
    "record_run",
    "report_scope",
    "reset_report",
]


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """What one replica of a Ray run did (``RunStats.replicas``).

    Attributes
    ----------
    replica : int
        Its number in the run.
    node : str
        The Ray node it ran on.
    rows : int
        Rows it answered (their outcomes reached the driver).
    requests : int
        Requests it sent for them, retries included.
    prompt_tokens, cached_tokens, output_tokens : int
        Usage its backend reported for those rows, summed over attempts.
    wall_seconds : float
        From the run's start to its last answer.
    died : bool
        Whether it died during the run (its unanswered rows went to the others).
    """

    replica: int
    node: str
    rows: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    wall_seconds: float
    died: bool = False

    @property
    def cached_share(self) -> float:
        """Share of its prompt tokens served from its engine's prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class RunStats:
    """Statistics of one relQuery run (``semframe.last_run()``).

    Token figures are what the backend reported, summed over every attempt;
    rows served from the result cache send nothing and count in ``cache_hits``
    only (``cache_saved_usage`` is the usage they were first paid for, and
    ``cache_saved_dollars`` what it would cost now; ``None`` where the model
    has no price).

    A request whose answer was lost after it reached the provider (a dropped
    connection, a truncated body, a read timeout) may have been billed with no
    usage reported. It counts in ``unconfirmed``; ``unconfirmed_tokens`` is
    the charge counted for those requests (their prompt tokens, uncached, and
    as output the longest answer of the run so far, or ``max_tokens`` before
    any: an estimate on the high side), and ``unconfirmed_dollars`` its price.
    ``dollars`` is the reported usage's price plus that charge, so that a
    budget is not passed by answers that were paid for and lost.

    ``rate_limited`` counts the provider's 429s (each retried; the run slowed
    down at the first), and ``paced_seconds`` the time requests waited to keep
    within the account's rate limits (summed over requests).

    ``replicas`` holds one :class:`ReplicaStats` per replica of a run with
    ``executor="ray"`` (empty for a run in this process).

    ``calibration`` counts the requests that calibrated the run's decisions
    (``filter`` and ``classify`` with ``calibrate=``: content-free inputs or
    labeled rows, sent in the same run). They are in ``requests`` and the
    token figures, not in ``rows``, which are the caller's.
    """

    op: str
    backend: str
    model: str
    reorder: str
    rows: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    errors: int
    retries: int
    wall_seconds: float
    workers: int
    expected_hit_rate: float
    dollars: float | None = None
    batch: bool = False
    cache_hits: int = 0
    cache_saved_dollars: float | None = None
    unconfirmed: int = 0
    unconfirmed_tokens: int = 0
    unconfirmed_dollars: float | None = None
    rate_limited: int = 0
    paced_seconds: float = 0.0
    replicas: tuple[ReplicaStats, ...] = ()
    calibration: int = 0
    cache_saved_usage: Usage = field(default_factory=Usage)

    @property
    def cached_share(self) -> float:
        """Share of prompt tokens served from the backend's prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def __repr__(self) -> str:
        served_all = self.cache_hits == self.rows + self.calibration
        if self.cache_hits and served_all and not self.requests:
            # Zeros everywhere would hide what happened: say it, and how to run afresh.
            answers = "the answer" if self.rows == 1 else f"all {self.rows:,} answers"
            return (
                f"RunStats({self.op} on {self.backend}/{self.model}: {answers} came from the "
                "result cache (stored by an earlier run); nothing was sent"
                + (
                    f", saving ${self.cache_saved_dollars:.4f}"
                    if self.cache_saved_dollars is not None
                    else ""
                )
                + ". To run it afresh: cache=False (or SEMFRAME_CACHE=false), or delete the "
                "stored answers with `semframe cache clear`)"
            )
        return (
            f"RunStats({self.op} on {self.backend}/{self.model}, reorder={self.reorder}: "
            f"{plural(self.rows, 'row')}, {plural(self.requests, 'request')}"
            + (f" ({self.calibration:,} calibrating)" if self.calibration else "")
            + ", "
            f"{plural(self.errors, 'error')}, {plural(self.retries, 'retry', 'retries')}; "
            f"prompt {self.prompt_tokens:,} tok, cached "
            f"{self.cached_tokens:,} ({self.cached_share:.1%}), output {self.output_tokens:,} "
            f"tok; {self.wall_seconds:.2f} s with {plural(self.workers, 'worker')}"
            + (f"; ${self.dollars:.4f}" if self.dollars is not None else "")
            + (
                f" (with {plural(self.unconfirmed, 'answer')} lost after being sent, charged "
                f"{self.unconfirmed_tokens:,} tok unconfirmed)"
                if self.unconfirmed
                else ""
            )
            + (
                f"; {self.rate_limited:,} rate-limited (429), paced {self.paced_seconds:.1f} s"
                if self.rate_limited
                else ""
            )
            + (" (batch)" if self.batch else "")
            + (_replicas_line(self.replicas) if self.replicas else "")
            + (f"; {self.cache_hits:,} from the result cache" if self.cache_hits else "")
            + (
                f" (saved ${self.cache_saved_dollars:.4f})"
                if self.cache_hits and self.cache_saved_dollars is not None
                else ""
            )
            + ")"
        )

    def _table(self) -> list[tuple[str, str]]:
        """The figures as (what, value) lines; those that are zero and say nothing left out."""
        rows = [
            ("rows", f"{self.rows:,}"),
            (
                "requests sent",
                f"{self.requests:,}"
                + (f" ({plural(self.retries, 'retry', 'retries')})" if self.retries else "")
                + (f", {self.calibration:,} of them calibrating" if self.calibration else ""),
            ),
            ("errors", f"{self.errors:,}"),
            ("prompt tokens", f"{self.prompt_tokens:,}"),
            ("  cached", f"{self.cached_tokens:,} ({self.cached_share:.1%})"),
        ]
        if self.cache_write_tokens:
            rows.append(("  cache writes", f"{self.cache_write_tokens:,}"))
        rows += [
            ("output tokens", f"{self.output_tokens:,}"),
            ("wall time", f"{self.wall_seconds:,.2f} s with {plural(self.workers, 'worker')}"),
        ]
        if self.dollars is not None:
            where = "dollars (batch prices)" if self.batch else "dollars"
            rows.append((where, _money(self.dollars)))
        if self.unconfirmed:
            lost = f"{self.unconfirmed:,}, charged {self.unconfirmed_tokens:,} tok"
            if self.unconfirmed_dollars is not None:
                lost += f" ({_money(self.unconfirmed_dollars)})"
            rows.append(("answers lost after being sent", lost))
        if self.rate_limited:
            rows.append(
                ("rate-limited (429)", f"{self.rate_limited:,}, paced {self.paced_seconds:.1f} s")
            )
        if self.cache_hits:
            saved = self.cache_saved_dollars
            rows.append(
                (
                    "from the result cache",
                    f"{self.cache_hits:,}" + ("" if saved is None else f" (saved {_money(saved)})"),
                )
            )
        rows.append(("expected prefix reuse (plan)", f"{self.expected_hit_rate:.1%}"))
        rows.extend(
            (
                f"replica {r.replica}" + (" (died)" if r.died else ""),
                f"{r.rows:,} rows, {r.prompt_tokens:,} tok, cached {r.cached_tokens:,} "
                f"({r.cached_share:.1%}), {r.wall_seconds:,.2f} s",
            )
            for r in self.replicas
        )
        return rows

    def _repr_html_(self) -> str:
        head = f"RunStats: {self.op} on {self.backend}/{self.model}, reorder={self.reorder}"
        return f"<div><b>{escape(head)}</b>{html_table(self._table())}</div>"


def _replicas_line(replicas: Sequence[ReplicaStats]) -> str:
    died = sum(r.died for r in replicas)
    return f"; on {plural(len(replicas), 'Ray replica')}" + (f" ({died} died)" if died else "")


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}"


@dataclass(frozen=True)
class OpStats:
    """What one operator call cost, over all the relQueries it ran (``semframe.last_op()``).

    Operators such as ``agg`` (one relQuery per reduction level) and ``topk``
    (one per comparison round) run several relQueries; ``semframe.last_run()``
    describes only the last of them, this describes the whole call.

    Attributes
    ----------
    op : str
        The operator.
    runs : tuple of RunStats
        One per relQuery run, in order.
    counts : mapping of str to int
        Operator-specific figures, e.g. ``comparisons`` and
        ``naive_comparisons`` for ``topk``, ``pairs`` and ``naive_pairs`` for
        ``join``, ``levels`` for ``agg``.
    detail : object or None
        An operator's own report (a cascade's
        :class:`~semframe.operators.cascade.CascadeReport`).
    """

    op: str
    runs: tuple[RunStats, ...]
    counts: Mapping[str, int] = field(default_factory=dict)
    detail: object = None

    @property
    def llm_calls(self) -> int:
        """Requests sent, retries included, over every relQuery of the call."""
        return sum(r.requests for r in self.runs)

    @property
    def relqueries(self) -> int:
        """Number of relQueries run."""
        return len(self.runs)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over every run."""
        return sum(r.prompt_tokens for r in self.runs)

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens over every run."""
        return sum(r.cached_tokens for r in self.runs)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v:,}" for k, v in self.counts.items())
        return (
            f"OpStats({self.op}: {plural(self.relqueries, 'relQuery', 'relQueries')}, "
            f"{plural(self.llm_calls, 'LLM call')}, "
            f"prompt {self.prompt_tokens:,} tok, cached {self.cached_tokens:,}{extra})"
        )

    def _repr_html_(self) -> str:
        counts = "".join(f"; {k}={v:,}" for k, v in self.counts.items())
        head = (
            f"OpStats: {self.op}, {plural(self.relqueries, 'relQuery', 'relQueries')}, "
            f"{plural(self.llm_calls, 'LLM call')}{counts}"
        )
        rows = [
            (
                str(i),
                f"{r.rows:,}",
                f"{r.requests:,}",
                f"{r.errors:,}",
                f"{r.prompt_tokens:,}",
                f"{r.cached_tokens:,} ({r.cached_share:.1%})",
                f"{r.output_tokens:,}",
                f"{r.wall_seconds:,.2f} s",
                _money(r.dollars),
            )
            for i, r in enumerate(self.runs)
        ]
        names = ("relQuery", "rows", "requests", "errors", "prompt tok", "cached", "output tok")
        table = html_table(rows, head=(*names, "wall", "dollars"), left=0)
        return f"<div><b>{escape(head)}</b>{table}</div>"


@dataclass
class Report:
    """The most recent relQuery run and operator call (mutable: one per scope)."""

    run: RunStats | None = None
    op: OpStats | None = None


_PROCESS_REPORT = Report()
_report: ContextVar[Report] = ContextVar("semframe_report", default=_PROCESS_REPORT)


def last_run() -> RunStats | None:
    """Statistics of the most recent relQuery run (in this :func:`report_scope`).

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> _ = pd.DataFrame({"t": ["a"]}).llm.map("Echo {t}", backend="fake")
    >>> semframe.last_run().rows
    1
    """
    return _report.get().run


def last_op() -> OpStats | None:
    """Statistics of the most recent operator call, all its relQueries.

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> _ = pd.DataFrame({"t": ["a", "b"]}).llm.map("Echo {t}", backend="fake")
    >>> semframe.last_op().llm_calls, semframe.last_op().relqueries
    (2, 1)
    """
    return _report.get().op


def record_run(stats: RunStats) -> None:
    """Make ``stats`` what :func:`last_run` returns."""
    _report.get().run = stats


def record_op(
    op: str, runs: Sequence[RunStats], *, detail: object = None, **counts: int
) -> OpStats:
    """Record the statistics of an operator call (see :func:`last_op`)."""
    stats = OpStats(op, tuple(runs), dict(counts), detail)
    _report.get().op = stats
    return stats


def reset_report() -> None:
    """Forget the recorded statistics (of this scope)."""
    report = _report.get()
    report.run = report.op = None


@contextlib.contextmanager
def report_scope() -> Iterator[Report]:
    """Record ``last_run()``/``last_op()`` of the calls inside the block apart from the rest.

    Examples
    --------
    >>> import pandas as pd, semframe
    >>> from semframe.runtime.stats import report_scope
    >>> with report_scope() as report:
    ...     _ = pd.DataFrame({"t": ["a", "b", "c"]}).llm.map("Echo {t}", backend="fake")
    >>> report.run.rows
    3
    """
    token = _report.set(Report())
    try:
        yield _report.get()
    finally:
        _report.reset(token)
