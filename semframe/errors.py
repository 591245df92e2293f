"""The one error hierarchy of semframe.

Every error raised on purpose by semframe derives from :class:`SemframeError`, so
``except semframe.SemframeError`` catches them all. Messages name what was wrong
and what would have been valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any


class SemframeError(Exception):
    """Base class of all semframe errors."""


class TemplateError(SemframeError, ValueError):
    """A prompt template is malformed (empty, unbalanced braces, no placeholders...)."""


class ColumnError(SemframeError, KeyError):
    """A template names a column the frame does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class ConfigError(SemframeError, ValueError):
    """An unknown backend, option or invalid option value."""


class InputError(SemframeError, ValueError):
    """Input data cannot be sent as it is (unsupported frame type, cell too long...)."""


class BackendError(SemframeError, RuntimeError):
    """A backend failed in a way that is not specific to one row."""


class MissingDependencyError(SemframeError, ImportError):
    """An optional dependency is not installed; the message gives the install line.

    ``packages`` names every missing package the raiser knew of (PyPI names;
    empty where it did not say), so that one error can list them all.
    """

    def __init__(self, message: str, *, packages: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.packages = tuple(packages)


class TransientError(SemframeError):
    """A per-request failure that is worth retrying (timeout, 429, 5xx, connection).

    Backends raise it from ``complete``; the executor retries with backoff and
    records it against the row if retries run out. ``maybe_billed`` says the
    request reached the provider and its answer was lost on the way back (a
    dropped connection, a truncated body, a timeout while reading): the
    provider may have billed it, so the executor charges it conservatively.
    ``rate_limited`` says the provider refused it for the account's rate
    limit (HTTP 429): the executor then slows the whole run down, not only
    this request.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        maybe_billed: bool = False,
        rate_limited: bool = False,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.maybe_billed = maybe_billed
        self.rate_limited = rate_limited


class RequestRejected(SemframeError):
    """A per-request failure that retrying cannot fix (the API refused this one prompt).

    The executor records it against the row at once, without retries, and the
    run goes on.
    """


class RunAborted(BackendError):
    """A run stopped early because the backend failed for every request alike.

    Raised for errors no retry can fix (a rejected API key, an unknown model).
    ``answered`` counts rows that had been answered before the stop; ``outcomes``
    holds them (in the caller's row order; ``None`` where nothing was received).
    """

    def __init__(self, message: str, *, answered: int = 0, outcomes: list[Any] | None = None):
        super().__init__(message)
        self.answered = answered
        self.outcomes = outcomes or []


class BudgetExceeded(SemframeError):
    """A call would cost, or has cost, more than its ``budget=``.

    Raised before anything is sent when the estimate is over the budget
    (``estimate`` set, ``result`` ``None``, nothing spent), or during a run when
    the spend reached it: no further request is sent, requests in flight
    complete, and ``result`` holds what the call returns with the answers paid
    for (rows never sent have no value, as failed rows do: a missing value, or
    kept with an ``llm_error`` saying ``budget``).

    Attributes
    ----------
    estimate : Estimate or None
        The pre-run estimate.
    budget : Budget or None
        The budget that was exceeded.
    spent : float or int or None
        Dollars (or tokens, for a token budget) spent when the run stopped.
    result : object
        The partial result (mid-run stop), else ``None``.
    outcomes : list
        Per row of the stopped relQuery, in the caller's order: an outcome or
        ``None`` (not sent).
    stats : RunStats or None
        Statistics of the stopped relQuery.
    """

    def __init__(
        self,
        message: str,
        *,
        estimate: Any = None,
        budget: Any = None,
        spent: float | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.budget = budget
        self.spent = spent
        self.result = result
        self.outcomes: list[Any] = []
        self.stats: Any = None


@dataclass(frozen=True)
class RowError:
    """Why one row has no value.

    Attributes
    ----------
    row : int
        Position of the row in the caller's frame (0-based).
    label : object
        The row's index label in the caller's frame (position for Polars).
    kind : str
        ``"parse"`` (answer did not match the expected format), ``"backend"``
        (the request failed after retries) or ``"context"``.
    message : str
        Human-readable detail, including the raw answer for parse errors.
    attempts : int
        How many times the request was sent.
    """

    row: int
    label: object
    kind: str
    message: str
    attempts: int


class RowErrors(SemframeError):
    """Rows failed after retries; nothing that succeeded is lost.

    The message says how many rows failed and, when every row of the call
    failed, that nothing succeeded (rather than pointing at other rows' answers).

    Parameters
    ----------
    errors : iterable of RowError
        The failed rows.
    result : object
        See the attribute.
    total : int, optional
        How many rows the call had. Without it, it is read from ``result`` when
        that is an operator's row-aligned output (every input row, with one value
        per row in each new column: ``map``, ``extract``, ``classify``); else it
        stays unknown and the message does not say whether all rows failed.

    Attributes
    ----------
    errors : tuple of RowError
        One entry per failed row, in the caller's row order.
    result : object
        The frame the call would have returned, with failed rows holding a
        missing value in the output column (for ``filter``: failed rows are
        included, and the ``error`` column says why). Use it to keep the paid-for
        answers, or re-run with ``errors="keep"`` to get it directly.
    total : int or None
        How many rows the call had (``None``: not known).

    Examples
    --------
    >>> failed = [RowError(i, i, "parse", "expected a yes/no answer", 2) for i in range(2)]
    >>> print(str(RowErrors(failed, None, total=3)).splitlines()[0])
    2 rows failed; the other rows succeeded and are in `.result` of this exception (or pass errors='keep' to get them with an error column).
    >>> print(str(RowErrors(failed, None, total=2)).splitlines()[0])
    all 2 rows failed; nothing succeeded. `.result` of this exception holds the frame with no answers; pass errors='keep' to get it with an error column saying why each row failed.
    """  # noqa: E501

    def __init__(
        self, errors: Iterable[RowError], result: Any, *, total: int | None = None
    ) -> None:
        self.errors = tuple(errors)
        self.result = result
        self.total = _row_count(result) if total is None else total
        n = len(self.errors)
        shown = "\n".join(
            f"  row {e.row} (label {e.label!r}): {e.kind} error after "
            f"{plural(e.attempts, 'attempt')}: {e.message}"
            for e in self.errors[:5]
        )
        more = f"\n  ... and {n - 5} more" if n > 5 else ""
        if n and self.total == n:
            every = "the only row failed" if n == 1 else f"all {n} rows failed"
            head = (
                f"{every}; nothing succeeded. `.result` of this exception holds the frame "
                "with no answers; pass errors='keep' to get it with an error column saying "
                "why each row failed."
            )
        else:
            head = (
                f"{plural(n, 'row')} failed; the other rows succeeded and are in `.result` of this "
                "exception (or pass errors='keep' to get them with an error column)."
            )
        super().__init__(f"{head}\n{shown}{more}")

    def _repr_html_(self) -> str:
        """The failed rows as a table (what a notebook shows for a caught ``RowErrors``).

        Examples
        --------
        >>> err = RowErrors([RowError(0, "<a>", "parse", "got <b>", 1)], None)
        >>> html = err._repr_html_()
        >>> "&#x27;&lt;a&gt;&#x27;" in html, "got &lt;b&gt;" in html, "<b>1 row failed</b>" in html
        (True, True, True)
        """
        shown = self.errors[:HTML_ROWS]
        body = "".join(
            f"<tr><td>{e.row}</td><td>{escape(repr(e.label))}</td><td>{escape(e.kind)}</td>"
            f"<td>{e.attempts}</td><td style='text-align:left;white-space:pre-wrap'>"
            f"{escape(e.message)}</td></tr>"
            for e in shown
        )
        n = len(self.errors)
        more = f"<p>... and {n - len(shown):,} more</p>" if n > len(shown) else ""
        head = str(self.args[0]).split("\n", 1)[0] if self.args else ""
        first, _, rest = head.partition(";")
        return (
            f"<div><b>{escape(first)}</b>{escape(';' + rest if rest else '')}"
            "<table><thead><tr><th>row</th><th>label</th><th>error</th><th>attempts</th>"
            f"<th style='text-align:left'>why</th></tr></thead><tbody>{body}</tbody></table>"
            f"{more}</div>"
        )


HTML_ROWS = 50
"""Failed rows a :class:`RowErrors` table shows in a notebook (the rest are counted)."""


def _row_count(result: Any) -> int | None:
    """Rows of an operator's row-aligned result, or ``None`` when it cannot tell.

    An operator's ``Output`` (``semframe.core.frames``, which this base module
    cannot import) that keeps every input row (``rows`` is ``None``) holds one
    value per row in each of its new columns.
    """
    if getattr(result, "rows", False) is not None:
        return None
    columns = getattr(result, "columns", None)
    if not isinstance(columns, tuple) or not columns:
        return None
    values = getattr(columns[0], "values", None)
    return len(values) if isinstance(values, Sequence) else None


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """Return a ``" Did you mean 'x'?"`` hint, or an empty string.

    Examples
    --------
    >>> did_you_mean("moive_title", ["movie_title", "review"])
    " Did you mean 'movie_title'?"
    >>> did_you_mean("zzz", ["movie_title"])
    ''
    """
    import difflib

    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def format_choices(valid: Iterable[object] | Mapping[str, object]) -> str:
    """Format valid choices for an error message.

    Examples
    --------
    >>> format_choices(["a", "b"])
    "'a', 'b'"
    """
    return ", ".join(repr(v) for v in valid)


def plural(count: int, word: str, many: str | None = None) -> str:
    """A count with its noun in the right number: ``1 row``, ``0 rows``, ``1,200 rows``.

    Parameters
    ----------
    count : int
        How many.
    word : str
        The noun for one.
    many : str, optional
        The noun for any other count (default: ``word + "s"``).

    Examples
    --------
    >>> plural(1, "row"), plural(0, "row"), plural(1200, "retry", "retries")
    ('1 row', '0 rows', '1,200 retries')
    """
    return f"{count:,} {word if count == 1 else (many or word + 's')}"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a notebook's interrupt) stopped a run; the answers received are kept.

    A ``KeyboardInterrupt``, so code that catches ``Exception`` does not swallow
    it. ``answered`` counts the rows answered before the stop; ``outcomes``
    holds them in the caller's row order (``None`` where nothing was received);
    ``stored`` says whether they are in the result cache, so that running the
    same call again sends only the rest.
    """

    def __init__(self, message: str, *, answered: int, outcomes: list[Any], stored: bool) -> None:
        super().__init__(message)
        self.answered = answered
        self.outcomes = outcomes
        self.stored = stored
