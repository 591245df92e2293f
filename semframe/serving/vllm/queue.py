"""vLLM's waiting queue, ordered by a semframe scheduling policy (no vLLM import).

vLLM's V1 scheduler admits waiting requests by peeking and popping its waiting
queue until a budget runs out; requests it cannot admit this step are popped
and prepended back at the end of the step, preempted requests are prepended.
:class:`PolicyQueue` implements that queue's interface over a
:class:`semframe.serving.sched.base.Scheduler`: every membership change is reported to
the policy (``add_waiting``, ``prepend_waiting``, ``remove_waiting``), and
:meth:`PolicyQueue.refresh` (called at the start of each engine step) asks the
policy for its order. Between refreshes, prepended requests come first and new
arrivals last, as in vLLM's own FCFS queue.

The engine's request objects are opaque here: the queue needs only their id
(``key``) and the :class:`SchedRequest` mirror the scheduler keeps for each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from semframe.serving.sched.base import SchedContext, SchedRequest, Scheduler


class PolicyQueue:
    """A waiting queue whose order a semframe policy decides.

    Parameters
    ----------
    policy : Scheduler
        The policy (see :func:`semframe.serving.sched.policies.make_scheduler`).
    mirror : callable
        Engine request -> its :class:`SchedRequest` (the same object every time).
    key : callable
        Engine request -> its id.

    Examples
    --------
    Two relQueries queued together; RelServe-style policies put the one that
    finishes sooner first, here the static-priority policy (sum of estimates):

    >>> from semframe.serving.sched.policies import make_scheduler
    >>> from semframe.serving.sched.base import Budgets
    >>> reqs = [SchedRequest(i, 0, 3, "big", 500, 50, 0.0) for i in range(3)]
    >>> reqs.append(SchedRequest(3, 1, 1, "small", 50, 5, 0.1))
    >>> q = PolicyQueue(make_scheduler("static"), mirror=lambda r: r, key=lambda r: r.req_id)
    >>> for r in reqs:
    ...     q.add_request(r)
    >>> [r.req_id for r in q]  # before a refresh: arrival order
    [0, 1, 2, 3]
    >>> q.refresh(SchedContext(1.0, [], cache=None, budgets=Budgets()))  # type: ignore[arg-type]
    >>> q.pop_request().req_id, len(q)
    (3, 3)
    """

    def __init__(
        self,
        policy: Scheduler,
        *,
        mirror: Callable[[Any], SchedRequest],
        key: Callable[[Any], Any],
    ) -> None:
        self.policy = policy
        self._mirror = mirror
        self._key = key
        self._members: dict[Any, Any] = {}
        self._order: list[Any] = []
        self._cursor = 0
        self._front: deque[Any] = deque()
        self._back: list[Any] = []
        self._back_cursor = 0
        self.now: float = 0.0

    # -- the policy's view ---------------------------------------------------

    def refresh(self, ctx: SchedContext) -> None:
        """Start of a step: let the policy update priorities, take its order."""
        self.now = ctx.now
        self.policy.update(ctx)
        by_req: dict[int, Any] = {}
        for request in self._members.values():
            by_req[self._mirror(request).req_id] = request
        order: list[Any] = []
        for sr in self.policy.iter_waiting(ctx):
            request = by_req.pop(sr.req_id, None)
            if request is not None:
                order.append(request)
        order.extend(by_req.values())  # unknown to the policy: keep them, last
        self._order = order
        self._cursor = 0
        self._front.clear()
        self._back = []
        self._back_cursor = 0

    def _candidates(self) -> Iterator[Any]:
        seen: set[Any] = set()  # a request popped and prepended back is listed twice
        for part in (self._front, self._order[self._cursor :], self._back[self._back_cursor :]):
            for request in part:
                k = self._key(request)
                if k in self._members and k not in seen:
                    seen.add(k)
                    yield request

    def _skip_gone(self) -> None:
        front, members, key = self._front, self._members, self._key
        while front and key(front[0]) not in members:
            front.popleft()
        order = self._order
        while self._cursor < len(order) and key(order[self._cursor]) not in members:
            self._cursor += 1
        back = self._back
        while self._back_cursor < len(back) and key(back[self._back_cursor]) not in members:
            self._back_cursor += 1

    # -- vLLM's RequestQueue interface -----------------------------------------

    def add_request(self, request: Any) -> None:
        """A new arrival: tell the policy, queue it last until the next refresh."""
        self._members[self._key(request)] = request
        self._back.append(request)
        self.policy.add_waiting(self._mirror(request), self.now)

    def peek_request(self) -> Any:
        """The request the policy wants admitted next."""
        self._skip_gone()
        for request in self._candidates():
            return request
        msg = "peek from an empty queue"
        raise IndexError(msg)

    def pop_request(self) -> Any:
        """Remove and return :meth:`peek_request`'s request (it leaves waiting)."""
        request = self.peek_request()
        self._drop(request)
        return request

    def prepend_request(self, request: Any) -> None:
        """A preempted or skipped request goes back to the front."""
        k = self._key(request)
        if k in self._members:
            return
        self._members[k] = request
        self._front.appendleft(request)
        self.policy.prepend_waiting(self._mirror(request))

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Prepend several, keeping their order (the first ends up first)."""
        for request in reversed(list(requests)):
            self.prepend_request(request)

    def remove_request(self, request: Any) -> None:
        """Take a request out (admitted elsewhere, aborted or finished)."""
        if self._key(request) in self._members:
            self._drop(request)

    def remove_requests(self, requests: Iterable[Any]) -> None:
        """:meth:`remove_request` for each."""
        for request in requests:
            self.remove_request(request)

    def _drop(self, request: Any) -> None:
        del self._members[self._key(request)]
        self.policy.remove_waiting(self._mirror(request))

    def __bool__(self) -> bool:
        return bool(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Any]:
        self._skip_gone()
        return iter(list(self._candidates()))
