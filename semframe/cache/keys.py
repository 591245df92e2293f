"""Result-cache keys: a digest of everything that determines an answer.

A request's key covers the backend's name, model and endpoint and the
rendered request (system message, prompt, ``max_tokens``, temperature, output
schema, logprobs asked for); never its position, row or group, and never a
credential. A call's key covers the backend and the call's plan fingerprint
(:func:`semframe.core.plan.fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from numpy.typing import NDArray

from semframe.core.requests import Requests
from semframe.core.wire import Request

if TYPE_CHECKING:
    from semframe.backends.base import Backend
    from semframe.core.plan import Plan

__all__ = [
    "KEY_BYTES",
    "KEY_VERSION",
    "Keys",
    "cacheable",
    "call_key",
    "plan_keys",
    "request_key",
    "request_keys",
]

_CHUNK = 8192
"""Prompts rendered together while keys are computed."""

KEY_VERSION = "semframe-result-v2"
"""Part of every key: bump it when what a key covers changes."""

KEY_BYTES = 32
"""Bytes of a request key: a SHA-256 digest (64 characters in hex)."""


class Keys(Sequence[str | None]):
    """The cache keys of a plan's requests, in plan order, held as one buffer of digests.

    ``keys[i]`` is request ``i``'s key in hex (:func:`request_key`), ``None``
    when the request is not cacheable; :meth:`digest` gives its 32 bytes. A
    million keys take 32 MB here, against 121 MB as a list of hex strings, and
    the cache reads and writes them as bytes without converting each one.

    Parameters
    ----------
    digests : bytes
        :data:`KEY_BYTES` bytes a request (zero bytes where it has no key).
    present : numpy array of bool, optional
        Whether each request has a key; ``None``: every one has.

    Examples
    --------
    >>> keys = Keys.of(["ab" * 32, None, "cd" * 32])
    >>> len(keys), keys[0] == "ab" * 32, keys[1], keys.digest(2) == bytes.fromhex("cd" * 32)
    (3, True, None, True)
    >>> keys.take(np.array([2, 0]))[0] == "cd" * 32
    True
    """

    __slots__ = ("_digests", "_present")

    def __init__(self, digests: bytes, present: NDArray[np.bool_] | None = None) -> None:
        if len(digests) % KEY_BYTES or (
            present is not None and present.size * KEY_BYTES != len(digests)
        ):
            msg = f"keys are {KEY_BYTES} bytes each, one per request"
            raise ValueError(msg)
        self._digests = digests
        self._present = None if present is None or present.all() else present

    @classmethod
    def of(cls, keys: Sequence[str | None]) -> Keys:
        """Keys from hex text (``None``: no key); a :class:`Keys` is returned as it is."""
        if isinstance(keys, Keys):
            return keys
        present = np.fromiter((k is not None for k in keys), dtype=bool, count=len(keys))
        blank = "00" * KEY_BYTES
        return cls(bytes.fromhex("".join(k or blank for k in keys)), present)

    def __len__(self) -> int:
        return len(self._digests) // KEY_BYTES

    @overload
    def __getitem__(self, i: int) -> str | None: ...

    @overload
    def __getitem__(self, i: slice) -> list[str | None]: ...

    def __getitem__(self, i: int | slice) -> str | list[str | None] | None:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        digest = self.digest(i)
        return None if digest is None else digest.hex()

    def digest(self, i: int) -> bytes | None:
        """Request ``i``'s key as its 32 bytes; ``None`` when it has none."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            msg = f"key {i} of {n}"
            raise IndexError(msg)
        if self._present is not None and not self._present[i]:
            return None
        return self._digests[i * KEY_BYTES : (i + 1) * KEY_BYTES]

    @property
    def complete(self) -> bool:
        """Whether every request has a key."""
        return self._present is None

    def present(self) -> tuple[bytes, NDArray[np.intp]]:
        """The keys of the requests that have one, joined, and those requests' positions."""
        if self._present is None:
            return self._digests, np.arange(len(self), dtype=np.intp)
        at = np.flatnonzero(self._present)
        return self._rows()[at].tobytes(), at

    def take(self, positions: NDArray[np.integer[Any]]) -> Keys:
        """The keys of the requests at ``positions``, in that order."""
        present = None if self._present is None else self._present[positions]
        return Keys(self._rows()[positions].tobytes(), present)

    def taken(self, positions: NDArray[np.integer[Any]], chunk: int = 65_536) -> Iterator[bytes]:
        """:meth:`take`'s keys joined, ``chunk`` keys at a time: never a copy of them all.

        Examples
        --------
        >>> keys = Keys.of(["ab" * 32, "cd" * 32, "ef" * 32])
        >>> order = np.array([2, 0, 1])
        >>> b"".join(keys.taken(order, chunk=2)) == keys.take(order).joined()
        True
        """
        rows = self._rows()
        for lo in range(0, len(positions), chunk):
            yield rows[positions[lo : lo + chunk]].tobytes()

    def _rows(self) -> NDArray[np.uint8]:
        """The digests as an array, a row of :data:`KEY_BYTES` bytes a request (no copy)."""
        return np.frombuffer(self._digests, dtype=np.uint8).reshape(len(self), KEY_BYTES)

    def joined(self) -> bytes:
        """Every key, joined (zero bytes where a request has none)."""
        return self._digests

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return self._digests == other._digests and list(self) == list(other)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Keys({len(self):,} requests)"


def cacheable(request: Request) -> bool:
    """Whether ``request`` is cached: only deterministic (temperature 0) requests are.

    Examples
    --------
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> cacheable(r), cacheable(r._replace(temperature=0.7))
    (True, False)
    """
    return request.temperature == 0


def call_key(backend: Backend, fingerprint: str) -> str:
    """The key of a call's entry: its plan ``fingerprint`` on ``backend`` (model, endpoint).

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> call_key(FakeBackend(), "ab") == call_key(FakeBackend(model="other"), "ab")
    False
    """
    base = [KEY_VERSION, "call", backend.name, backend.model, backend.endpoint]
    text = json.dumps([*base, fingerprint], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def request_key(backend: Backend, request: Request) -> str:
    """The cache key of ``request`` on ``backend``: a SHA-256 hex digest.

    It covers the backend name, model and ``base_url`` (when the backend has
    one) and the request's content and decoding parameters; not its position,
    row or prefix group, and never a credential.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0)
    >>> k = request_key(FakeBackend(), r)
    >>> len(k), k == request_key(FakeBackend(), r._replace(id=5, row=9, group=2))
    (64, True)
    >>> k == request_key(FakeBackend(model="other"), r)
    False
    """
    return request_keys(backend, [request])[0]


def request_keys(backend: Backend, requests: Sequence[Request]) -> list[str]:
    """:func:`request_key` of each of ``requests`` (fast for the requests of one plan).

    Everything but the prompt is hashed once per distinct combination, as JSON
    (which never holds a NUL byte); the prompt follows after a NUL, so distinct
    requests cannot collide by shifting text between fields.

    Examples
    --------
    >>> from semframe.backends.fake import FakeBackend
    >>> rs = [Request(i, i, f"p{i}", None, 8, 0.0, None, 0) for i in range(3)]
    >>> request_keys(FakeBackend(), rs)[2] == request_key(FakeBackend(), rs[2])
    True
    """
    heads: dict[tuple[Any, ...], Any] = {}
    keys: list[str] = []
    for r in requests:
        ident = (r.system, r.max_tokens, r.temperature, id(r.schema), r.logprobs)
        found = heads.get(ident)
        if found is None:  # the schema is held so that its id stays unique
            found = heads[ident] = (_head(backend, r), r.schema)
        digest = found[0].copy()
        digest.update(r.prompt.encode("utf-8", "surrogatepass"))
        keys.append(digest.hexdigest())
    return keys


def plan_keys(plan: Plan, backend: Backend) -> Keys:
    """The cache key of each request of ``plan`` (``None``: not cacheable), in plan order."""
    requests = plan.requests
    n = len(requests)
    if isinstance(requests, Requests):  # one set of decoding parameters: hash the prompts
        if not requests or not cacheable(requests[0]):  # every request is alike
            return Keys(bytes(KEY_BYTES * n), np.zeros(n, dtype=bool))
        return Keys(b"".join(_prompt_digests(backend, requests)))
    wanted = [r for r in requests if cacheable(r)]
    digests = bytearray(KEY_BYTES * n)
    present = np.zeros(n, dtype=bool)
    for r, key in zip(wanted, request_keys(backend, wanted), strict=True):
        digests[r.id * KEY_BYTES : (r.id + 1) * KEY_BYTES] = bytes.fromhex(key)
        present[r.id] = True
    return Keys(bytes(digests), present)


def _head(backend: Backend, request: Request) -> Any:
    """A hash of everything in ``request``'s key but its prompt, then the NUL before it."""
    schema = None if request.schema is None else json.dumps(request.schema, sort_keys=True)
    parts: list[Any] = [KEY_VERSION, backend.name, backend.model, backend.endpoint]
    parts.append(request.system)
    parts += [request.max_tokens, repr(float(request.temperature)), schema, request.logprobs]
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass") + b"\x00")


def _prompt_digests(backend: Backend, requests: Requests) -> Iterator[bytes]:
    """:func:`request_keys` of ``requests``, whose decoding parameters are shared, as bytes.

    Prompts are rendered a chunk at a time and no request is built. What every
    prompt starts with (the instructions) is hashed once: each prompt's rest is
    hashed from there.
    """
    head = _head(backend, requests[0])
    head.update(requests.head.encode("utf-8", "surrogatepass"))
    for start in range(0, len(requests), _CHUNK):
        for rest in requests.prompts(start, start + _CHUNK, head=False):
            digest = head.copy()
            digest.update(rest.encode("utf-8", "surrogatepass"))
            yield digest.digest()
