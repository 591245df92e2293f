"""Reference implementations and strategies shared by the reordering tests.

Everything here is deliberately naive (plain Python over strings) so that it
checks the numpy implementations in ``semframe.reorder`` independently.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from hypothesis import strategies as st

from semframe.core.ordering import Ordering
from semframe.core.table import Table

Measure = Callable[[str], int]

# Low-cardinality values, with an empty cell and the rendered missing value.
VALUES = ("a", "b", "ab", "xyz", "", "<missing>", "long value " * 3)


@st.composite
def tables(
    draw: st.DrawFn,
    max_rows: int = 8,
    max_cols: int = 4,
    min_rows: int = 0,
    min_cols: int = 0,
    values: Sequence[str] = VALUES,
) -> Table:
    """Small tables of low-cardinality text cells."""
    n = draw(st.integers(min_rows, max_rows))
    m = draw(st.integers(min_cols, max_cols))
    data: dict[str, list[str]] = {}
    for j in range(m):
        k = draw(st.integers(1, 3))
        pool = draw(st.lists(st.sampled_from(values), min_size=k, max_size=k, unique=True))
        data[f"c{j}"] = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    if m == 0:
        return Table((), {}, n)
    return Table.from_columns(data)


@st.composite
def tables_with_orderings(draw: st.DrawFn) -> tuple[Table, Ordering]:
    """A table and an arbitrary valid ordering of it (random rows and field orders)."""
    t = draw(tables(max_rows=10, max_cols=4))
    rows = draw(st.permutations(range(t.n_rows)))
    perms = list(itertools.permutations(t.columns))
    fields = [draw(st.sampled_from(perms)) for _ in rows]
    return t, Ordering(tuple(rows), tuple(fields))


def prompts(t: Table, o: Ordering) -> list[list[tuple[str, str]]]:
    """Each executed prompt as its list of (column, value) cells."""
    return [[(c, t.cells[c][r]) for c in f] for r, f in zip(o.rows, o.fields, strict=True)]


def ref_phc(t: Table, o: Ordering, measure: Measure = len) -> int:
    """The paper's eq. 1-2, literally."""
    total = 0
    seq = prompts(t, o)
    for prev, cur in itertools.pairwise(seq):
        for a, b in zip(prev, cur, strict=True):
            if a != b:
                break
            total += measure(a[1]) ** 2
    return total


def seg(cell: tuple[str, str]) -> str:
    return f"{cell[0]}: {cell[1]}\n"


def ref_hit_rate(t: Table, o: Ordering, cache: str, measure: Measure = len) -> float:
    """Share of segment characters served by a prefix cache, literally."""
    seq = prompts(t, o)
    total = sum(measure(seg(c)) for p in seq for c in p)
    if total == 0:
        return 0.0
    served = 0
    seen: set[tuple[tuple[str, str], ...]] = set()
    prev: list[tuple[str, str]] = []
    for p in seq:
        if cache == "previous":
            for a, b in zip(prev, p, strict=False):
                if a != b:
                    break
                served += measure(seg(b))
        else:
            for j in range(1, len(p) + 1):
                if tuple(p[:j]) not in seen:
                    break
                served += measure(seg(p[j - 1]))
            seen.update(tuple(p[:j]) for j in range(1, len(p) + 1))
        prev = p
    return served / total


def ref_upper_bound(t: Table, measure: Measure = len) -> int:
    total = 0
    for c in t.columns:
        counts: dict[str, int] = {}
        for v in t.cells[c]:
            counts[v] = counts.get(v, 0) + 1
        total += sum(measure(v) ** 2 * (k - 1) for v, k in counts.items())
    return total


def brute_force_literal(t: Table) -> int:
    """Best PHC over every row permutation x every per-row field permutation."""
    n = t.n_rows
    field_perms = list(itertools.permutations(t.columns))
    best = 0
    for rows in itertools.permutations(range(n)):
        for fields in itertools.product(field_perms, repeat=n):
            best = max(best, ref_phc(t, Ordering(rows, fields)))
    return best


def brute_force_sorted(t: Table) -> int:
    """Best PHC over every per-row field permutation, rows in the best order.

    For fixed field orders, sorting the prompts (as sequences of cells) puts
    every shared prefix in one run, which maximizes the sum of consecutive
    common prefixes; so this equals the literal brute force, much faster.
    """
    n = t.n_rows
    field_perms = list(itertools.permutations(t.columns))
    best = 0
    for fields in itertools.product(field_perms, repeat=n):
        order = sorted(range(n), key=lambda r: [(c, t.cells[c][r]) for c in fields[r]])
        o = Ordering(tuple(order), tuple(fields[r] for r in order))
        best = max(best, ref_phc(t, o))
    return best


def is_valid(t: Table, o: Ordering) -> bool:
    o.validate(t.n_rows, t.columns)
    return True
