"""Paged KV cache with block-level prefix caching and LRU eviction (vLLM's design).

The cache has ``num_blocks`` blocks of ``block_size`` tokens. A full block of
prompt tokens is identified by a hash of its tokens chained with its parent
block's hash (:func:`block_hashes`), so equal hashes mean equal prefixes. When
a request is admitted, its leading blocks found in the cache are shared (their
reference count goes up); blocks it computes are registered under their hash
once computed. Freed blocks that carry a hash stay in the cache, unreferenced,
in LRU order, and are evicted only when a fresh block is needed.

Invariant (property-tested): every block is exactly one of free (no hash),
cached-unreferenced (evictable), or referenced; no block is lost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from semframe.serving.sched.base import SchedRequest


def block_hashes(tokens: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``tokens``.

    Examples
    --------
    >>> a = block_hashes([1, 2, 3, 4, 5], 2)
    >>> b = block_hashes([1, 2, 3, 9], 2)
    >>> len(a), a[0] == b[0], a[1] == b[1]
    (2, True, False)
    """
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return tuple(out)


class KVCache:
    """Block manager of the simulated engine.

    Examples
    --------
    >>> kv = KVCache(num_blocks=8, block_size=2)
    >>> r = SchedRequest(0, 0, 1, "t", 5, 3, 0.0, block_hashes=block_hashes([1, 2, 3, 4, 5], 2))
    >>> kv.admit(r)          # nothing cached yet
    0
    >>> kv.grow(r, 5)        # compute the prompt: 3 blocks
    True
    >>> kv.commit(r, 5)      # its 2 full blocks become shareable
    >>> kv.free(r)
    >>> s = SchedRequest(1, 0, 1, "t", 5, 3, 0.0, block_hashes=r.block_hashes)
    >>> kv.admit(s)          # 4 prompt tokens found in the cache
    4
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            msg = f"num_blocks and block_size must be >= 1; got {num_blocks}, {block_size}."
            raise ValueError(msg)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # plain free blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced (LRU)
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._tables: dict[int, list[int]] = {}  # req_id -> block ids
        self._committed: dict[int, int] = {}  # req_id -> full blocks registered
        self.hits = 0
        self.queries = 0

    # -- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free or evictable)."""
        return len(self._free) + len(self._evictable)

    def cached_prefix(self, req: SchedRequest) -> int:
        """Prompt tokens of ``req`` in the cache (walk until the first miss)."""
        n = 0
        by_hash = self._by_hash
        for h in req.block_hashes:
            if h not in by_hash:
                break
            n += 1
        return n * self.block_size

    def probe_prefix(self, req: SchedRequest) -> int:
        """Binary search for the cached prefix: exact when cached blocks form prefixes.

        LRU frees a request's blocks tail first, so the cached blocks of a chain
        are almost always a prefix of it; this costs O(log blocks) lookups.
        """
        hs = req.block_hashes
        by_hash = self._by_hash
        lo, hi = 0, len(hs)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hs[mid - 1] in by_hash:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_size

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens``."""
        return -(-tokens // self.block_size)

    def evictable_hits(self, req: SchedRequest, cached: int) -> int:
        """Blocks of ``req``'s first ``cached`` tokens that are cached but unreferenced.

        Sharing them takes them out of the evictable pool.
        """
        n = cached // self.block_size
        by_hash = self._by_hash
        ref = self._ref
        return sum(1 for h in req.block_hashes[:n] if ref[by_hash[h]] == 0)

    def num_held(self, req: SchedRequest) -> int:
        """Blocks ``req`` holds."""
        return len(self._tables.get(req.req_id, ()))

    # -- mutations ---------------------------------------------------------------
    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        if self._evictable:
            blk, _ = self._evictable.popitem(last=False)
            h = self._hash_of[blk]
            if h is not None and self._by_hash.get(h) == blk:
                del self._by_hash[h]
            self._hash_of[blk] = None
            return blk
        return None

    def admit(self, req: SchedRequest) -> int:
        """Start holding ``req``'s cached prefix; return the prompt tokens it covers.

        At least one prompt token is always left to compute (a fully cached
        prompt still runs its last token to produce output).
        """
        table: list[int] = []
        limit = (req.num_known - 1) // self.block_size
        for h in req.block_hashes[:limit]:
            blk = self._by_hash.get(h)
            if blk is None:
                break
            if self._ref[blk] == 0:
                self._evictable.pop(blk, None)
            self._ref[blk] += 1
            table.append(blk)
        self._tables[req.req_id] = table
        self._committed[req.req_id] = len(table)
        self.queries += req.prompt_len
        self.hits += len(table) * self.block_size
        return len(table) * self.block_size

    def can_grow(self, req: SchedRequest, total_tokens: int) -> bool:
        """Whether ``req`` can hold ``total_tokens`` tokens without evicting others."""
        need = self.blocks_for(total_tokens) - len(self._tables.get(req.req_id, ()))
        return need <= self.num_free_blocks

    def grow(self, req: SchedRequest, total_tokens: int) -> bool:
        """Allocate blocks so ``req`` holds ``total_tokens`` tokens; False if out of blocks."""
        table = self._tables.setdefault(req.req_id, [])
        need = self.blocks_for(total_tokens) - len(table)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            blk = self._take()
            assert blk is not None  # checked by num_free_blocks above
            self._ref[blk] = 1
            table.append(blk)
        return True

    def commit(self, req: SchedRequest, computed: int) -> None:
        """Register the hashes of ``req``'s prompt blocks now fully computed."""
        table = self._tables.get(req.req_id)
        if table is None:
            return
        done = min(computed // self.block_size, len(req.block_hashes), len(table))
        start = self._committed.get(req.req_id, 0)
        for i in range(start, done):
            h = req.block_hashes[i]
            blk = table[i]
            if h not in self._by_hash and self._hash_of[blk] is None:
                self._by_hash[h] = blk
                self._hash_of[blk] = h
        self._committed[req.req_id] = max(start, done)

    def free(self, req: SchedRequest) -> None:
        """Release ``req``'s blocks; hashed ones stay cached (tail evicted first)."""
        table = self._tables.pop(req.req_id, [])
        self._committed.pop(req.req_id, None)
        for blk in reversed(table):
            self._ref[blk] -= 1
            if self._ref[blk] == 0:
                if self._hash_of[blk] is not None:
                    self._evictable[blk] = None
                else:
                    self._free.append(blk)

    # -- checks ----------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if any block is lost, double-counted or mis-referenced."""
        referenced = {b for t in self._tables.values() for b in t}
        free = set(self._free)
        evict = set(self._evictable)
        if len(free) != len(self._free):
            msg = "a block is twice in the free list"
            raise AssertionError(msg)
        if free & evict or free & referenced or evict & referenced:
            msg = "a block is in two states at once"
            raise AssertionError(msg)
        if len(free) + len(evict) + len(referenced) != self.num_blocks:
            msg = (
                f"blocks leaked: {len(free)} free + {len(evict)} evictable + "
                f"{len(referenced)} referenced != {self.num_blocks}"
            )
            raise AssertionError(msg)
        counts: dict[int, int] = {}
        for t in self._tables.values():
            for b in t:
                counts[b] = counts.get(b, 0) + 1
        for b in range(self.num_blocks):
            if self._ref[b] != counts.get(b, 0):
                msg = f"block {b}: ref {self._ref[b]} but held by {counts.get(b, 0)} requests"
                raise AssertionError(msg)
        for h, b in self._by_hash.items():
            if self._hash_of[b] != h:
                msg = f"hash map points block {b} at a hash it does not carry"
                raise AssertionError(msg)

    @property
    def num_referenced(self) -> int:
        """Blocks held by at least one request."""
        return sum(1 for r in self._ref if r)
