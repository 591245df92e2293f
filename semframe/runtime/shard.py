"""What the Ray executor sends between processes, packed: a shard of a plan, a batch of answers.

Ray pickles what an actor call carries. A shard as a :class:`~semframe.core.plan.Plan`
of :class:`~semframe.core.wire.Request` tuples costs a Python call per tuple
each way and carries each prompt whole, so a group's shared head (the
instructions, a long description) crosses once per row: 154 MB for 100,000
movies-shaped prompts. A plan whose requests are columns
(:class:`~semframe.core.requests.Requests`) is shipped as columns: the values
the shard's requests use, once each, and a code per request and field; the
replica renders each prompt as it sends it. Requests made one by one are
shipped as :class:`Shard` sends each prompt: the characters it shares with the
one before it plus the rest, and the requests' other fields as columns (one
value where all agree). :class:`Answers` sends a batch of outcomes as columns.
Both are rebuilt on the other side exactly as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from semframe.core.ordering import Ordering
from semframe.core.plan import Plan, PrefixGroup, RelQuery, groups_of, without_gc
from semframe.core.requests import Requests
from semframe.core.wire import Completion, Outcome, Request, Usage

__all__ = ["Answer", "Answers", "Shard"]


class Answer(NamedTuple):
    """One outcome of a replica's shard.

    Attributes
    ----------
    id : int
        The request's position in the replica's shard.
    outcome : Outcome
        What became of it.
    completion : Completion or None
        The answer to store in the result cache (parsed, not cut), else ``None``.
    """

    id: int
    outcome: Outcome
    completion: Completion | None


class _Same(NamedTuple):
    """A column whose every entry is ``value``."""

    value: Any


_ID, _OUTCOME, _KEPT = map(itemgetter, range(len(Answer._fields)))
_NO_USAGE = Usage()

_PER_REQUEST = Request._fields[3:]  # what a request carries besides its ids and prompt


@dataclass(frozen=True)
class Shard:
    """Some requests of a plan, in the order given, renumbered from 0, packed for shipping.

    Build with :meth:`of`; :meth:`plan` rebuilds them as a plan of their own
    (no table rows: a replica sends prompts, it does not render them).

    Attributes
    ----------
    relquery : RelQuery
        The plan's relQuery with an empty table.
    reorder, instructions : str
        As in the plan.
    ordering : Ordering
        Each request's field order, as an ordering of the shard's own requests
        (``rows`` are ``0..n-1``).
    shared_chars : tuple of int
        Each request's ``Plan.shared_chars``.
    kept : tuple of int
        Characters each prompt shares with the one before it in the shard.
    tails : tuple of str
        The rest of each prompt.
    columns : tuple
        The other request fields (``system`` to ``rel_size``), each a tuple
        or one value all requests share.
    requests : Requests or None
        The shard's requests as columns, renumbered (a plan whose requests
        are columns); ``kept``, ``tails`` and ``columns`` are then empty.

    Examples
    --------
    >>> from semframe.core.parse import TEXT
    >>> from semframe.core.table import Table
    >>> from semframe.core.template import parse_template
    >>> from semframe.core.plan import make_plan
    >>> t = Table.from_columns({"movie": ["Alien"] * 3, "review": ["tense", "scary", "long"]})
    >>> rq = RelQuery("map", parse_template("Summarize {review} of {movie}."), t, TEXT)
    >>> plan = make_plan(rq, Ordering.identity(3, ("movie", "review")), "none")
    >>> shard = Shard.of(plan, [2, 1])
    >>> list(shard.requests.values)  # the values the shard uses, once each
    ['scary', 'long', 'Alien']
    >>> [r.prompt for r in shard.plan().requests] == [plan.requests[2].prompt,
    ...                                               plan.requests[1].prompt]
    True

    Requests made one by one travel as the characters each prompt shares with
    the one before it, and the rest:

    >>> made = dataclasses.replace(plan, requests=tuple(plan.requests))
    >>> Shard.of(made, [2, 1]).tails
    ('Summarize [review] of [movie].\\n\\nmovie: Alien\\nreview: long\\n', 'review: scary\\n')
    """

    relquery: RelQuery
    reorder: str
    instructions: str
    ordering: Ordering
    shared_chars: tuple[int, ...]
    kept: tuple[int, ...]
    tails: tuple[str, ...]
    columns: tuple[Any, ...]
    requests: Requests | None = None

    @classmethod
    def of(cls, plan: Plan, ids: Sequence[int]) -> Shard:
        """The requests ``ids`` (positions in ``plan``, in shard order) of ``plan``."""
        with without_gc():
            return cls._of(plan, ids)

    @classmethod
    def _of(cls, plan: Plan, ids: Sequence[int]) -> Shard:
        rq = dataclasses.replace(plan.relquery, table=plan.relquery.table.take(()))
        ordering = plan.ordering.subset(ids)
        shared = tuple(plan.shared_chars[i] for i in ids)
        if isinstance(plan.requests, Requests):  # nothing rendered here
            columnar = plan.requests.take(ids).shipped()
            return cls(rq, plan.reorder, plan.instructions, ordering, shared, (), (), (), columnar)
        requests = [plan.requests[i] for i in ids]
        kept, tails = _deltas(requests, ids, plan.shared_chars)
        transposed = list(zip(*requests, strict=True)) if requests else []
        columns = tuple(
            _column(transposed[3 + k]) if requests else () for k in range(len(_PER_REQUEST))
        )
        return cls(rq, plan.reorder, plan.instructions, ordering, shared, kept, tails, columns)

    def __len__(self) -> int:
        return len(self.tails) if self.requests is None else len(self.requests)

    def plan(self) -> Plan:
        """The shard as a plan: requests ``0..n-1``, each its own row, groups as in the shard."""
        with without_gc():
            return self._plan()

    def _plan(self) -> Plan:
        if self.requests is not None:
            groups = tuple(PrefixGroup(a, b) for a, b in self.requests.group_bounds())
            return Plan(
                self.relquery,
                self.ordering,
                self.reorder,
                self.instructions,
                self.requests,
                groups,
                self.shared_chars,
            )
        n = len(self.tails)
        prompts = _inflate(self.kept, self.tails)
        expanded = [repeat(c.value, n) if isinstance(c, _Same) else c for c in self.columns]
        rows = zip(range(n), range(n), prompts, *expanded, strict=True)
        requests = tuple(map(tuple.__new__, repeat(Request, n), rows))
        return Plan(
            self.relquery,
            self.ordering,
            self.reorder,
            self.instructions,
            requests,
            tuple(groups_of(requests)),
            self.shared_chars,
        )


def _column(values: tuple[Any, ...]) -> Any:
    first = values[0]
    if values.count(first) == len(values) and all(type(v) is type(first) for v in values):
        return _Same(first)
    return values


def _deltas(
    requests: Sequence[Request], ids: Sequence[int], shared_chars: Sequence[int]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Per prompt: characters it shares with the previous one (checked), and the rest.

    The candidates are the plan's own: what it shares with the request before
    it in the plan (``shared_chars``, when that one is also before it here),
    then its cacheable prefixes, longest first. The first that the previous
    prompt really starts with is kept.
    """
    kept: list[int] = []
    tails: list[str] = []
    prev = ""
    last = -2
    for request, i in zip(requests, ids, strict=True):
        prompt = request.prompt
        keep = 0
        end = shared_chars[i] if i == last + 1 else 0
        if 0 < end <= len(prev) and prompt.startswith(prev[:end]):
            keep = end
        else:
            for end, _ in reversed(request.prefix):
                if 0 < end <= len(prev) and prompt.startswith(prev[:end]):
                    keep = end
                    break
        kept.append(keep)
        tails.append(prompt[keep:] if keep else prompt)
        prev = prompt
        last = i
    return tuple(kept), tuple(tails)


def _inflate(kept: Sequence[int], tails: Sequence[str]) -> list[str]:
    prompts: list[str] = []
    prev = ""
    for keep, tail in zip(kept, tails, strict=True):
        prev = prev[:keep] + tail if keep else tail
        prompts.append(prev)
    return prompts


@dataclass(frozen=True)
class Answers:
    """A batch of a replica's answers as columns.

    Attributes
    ----------
    ids : tuple of int
        Each answer's position in the replica's shard.
    outcomes : tuple of tuple
        The :class:`~semframe.core.wire.Outcome` fields, one column each.
    usage : Usage
        What the backend reported for the attempts the replica made since its
        batch before, summed (an answer's attempts may be billed in an
        earlier batch than the answer).
    largest_output : int
        The most output tokens of one of those attempts.
    completions : tuple of (Completion or None), or None
        The answers to store in the result cache, when the driver keeps one.

    Examples
    --------
    >>> o = Outcome("yes", "yes", None, None, 1)
    >>> batch = Answers.of([Answer(3, o, None)], usage=Usage(10, 4, 0, 1), largest_output=1)
    >>> batch.ids, batch.outcome_list(), batch.usage
    ((3,), [Outcome(value='yes', raw='yes', error_kind=None, error=None, attempts=1, \
logprobs=None)], Usage(prompt_tokens=10, cached_tokens=4, cache_write_tokens=0, output_tokens=1))
    """

    ids: tuple[int, ...]
    outcomes: tuple[tuple[Any, ...], ...]
    usage: Usage
    largest_output: int
    completions: tuple[Completion | None, ...] | None

    @classmethod
    def of(
        cls,
        answers: Sequence[Answer],
        *,
        usage: Usage = _NO_USAGE,
        largest_output: int = 0,
        completions: bool = False,
    ) -> Answers:
        """Pack ``answers`` and the ``usage`` billed since the batch before.

        Their completions go only with ``completions``.
        """
        if not answers:
            empty = ((),) * len(Outcome._fields)
            return cls((), empty, usage, largest_output, () if completions else None)
        # Column by column (``zip(*rows)`` took twice as long on a replica's batches).
        outcomes = tuple(map(_OUTCOME, answers))
        return cls(
            tuple(map(_ID, answers)),
            tuple(tuple(map(itemgetter(k), outcomes)) for k in range(len(Outcome._fields))),
            usage,
            largest_output,
            tuple(map(_KEPT, answers)) if completions else None,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def outcome_list(self) -> list[Outcome]:
        """The outcomes, in batch order."""
        return list(map(tuple.__new__, repeat(Outcome), zip(*self.outcomes, strict=True)))
