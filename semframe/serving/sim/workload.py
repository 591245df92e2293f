"""Workloads for the simulator: RelServe-shaped relQuery streams and k-LPM queues.

Token counts come from :func:`tokenize`, a deterministic stand-in for a model
tokenizer: the text is split into words and single punctuation marks
(``\\w+|[^\\w\\s]``) and each piece is mapped to an id by CRC-32. Equal text
gives equal ids, so prompts that share a prefix share KV blocks exactly as they
would with a real tokenizer; counts are about 25% below a BPE tokenizer's.

**relQuery streams** (:func:`relserve_workload`), after RelServe section 5.1:
each relQuery picks a table (``movies_small.csv`` or ``contributions.csv``), one
of five task types with the paper's output limits (filter 5, classify 10,
rate 5, summarize 50, open question 100 tokens), a size uniform in 1..100 and
that many consecutive rows from a random offset. A prompt is the task's
instruction followed by the row's fields as ``name: value`` lines (semframe's
prompt layout). True output lengths are uniform in ``[limit/2, limit]``.
relQueries arrive as a Poisson process; all requests of one arrive together.

**k-LPM queues** (:func:`klpm_workload`), after the k-LPM paper's Definition 4
and section 5: prompts ``(base)(user)(doc)`` with one shared base prompt, each
user context repeated ``repeats`` times, a unique doc per prompt, arrival order
shuffled, Poisson arrivals.
"""

from __future__ import annotations

import csv
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from semframe.errors import InputError
from semframe.serving.sim.engine import SimRequest
from semframe.serving.sim.kv import block_hashes

_PIECE = re.compile(r"\w+|[^\w\s]")
VOCAB = 50_000


def tokenize(text: str) -> list[int]:
    """Deterministic pseudo-tokens: words and punctuation hashed to ids.

    Examples
    --------
    >>> tokenize("Is it good?") == tokenize("Is it good?")
    True
    >>> len(tokenize("Is it good?"))
    4
    """
    return [zlib.crc32(p.encode()) % VOCAB for p in _PIECE.findall(text)]


@dataclass(frozen=True, slots=True)
class TaskType:
    """A relQuery task: name, output limit, and per-table instruction and fields."""

    name: str
    max_tokens: int
    templates: tuple[tuple[str, str, tuple[str, ...]], ...]  # (table, instruction, fields)


TASKS: tuple[TaskType, ...] = (
    TaskType(
        "filter",
        5,
        (
            (
                "movies",
                "Decide whether this movie is suitable for children based on its synopsis "
                "and the critic's review. Answer yes or no.",
                ("movie_title", "movie_info", "review_content"),
            ),
            (
                "contributions",
                "Decide whether this contribution comes from a retired person. Answer yes or no.",
                ("NAME", "EMPLOYER", "OCCUPATION", "TRANSACTION_AMT"),
            ),
        ),
    ),
    TaskType(
        "classify",
        10,
        (
            (
                "movies",
                "Categorize the sentiment of the review as Negative, Positive, or Neutral.",
                ("movie_title", "review_content"),
            ),
            (
                "contributions",
                "Classify the contributor's industry as Technology, Finance, Health, "
                "Education, Government, Retired or Other.",
                ("EMPLOYER", "OCCUPATION", "CITY", "STATE"),
            ),
        ),
    ),
    TaskType(
        "rate",
        5,
        (
            (
                "movies",
                "Predict the critic's rating of the movie from 1 to 5 given the synopsis and "
                "the review. Output only the digit.",
                ("movie_info", "review_content"),
            ),
            (
                "contributions",
                "Rate from 1 to 5 how likely this donor is to give again this year. "
                "Output only the digit.",
                ("NAME", "OCCUPATION", "TRANSACTION_DT", "TRANSACTION_AMT", "RPT_TP"),
            ),
        ),
    ),
    TaskType(
        "summarize",
        50,
        (
            (
                "movies",
                "Summarize the critic's review of the movie within 20 words.",
                ("movie_title", "movie_info", "review_content"),
            ),
            (
                "contributions",
                "Summarize this campaign contribution in one sentence.",
                ("CMTE_ID", "NAME", "CITY", "STATE", "EMPLOYER", "OCCUPATION", "TRANSACTION_AMT"),
            ),
        ),
    ),
    TaskType(
        "open",
        100,
        (
            (
                "movies",
                "Who are the most likely audiences for this movie given its description and "
                "the review? Explain briefly.",
                ("movie_title", "movie_info", "review_content"),
            ),
            (
                "contributions",
                "What can you infer about this donor's political interests from the "
                "contribution? Explain briefly.",
                ("NAME", "CITY", "STATE", "EMPLOYER", "OCCUPATION", "CMTE_ID", "CAND_ID"),
            ),
        ),
    ),
)
"""The five relQuery task types of RelServe with their output limits."""

TABLE_FILES = {"movies": "movies_small.csv", "contributions": "contributions.csv"}


def default_data_dir() -> Path:
    """``../shared/data`` relative to the working directory's project, if present."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent.parent / "shared" / "data"
        if (cand / "movies_small.csv").exists():
            return cand
    return Path("../shared/data")


def load_tables(
    data_dir: str | Path | None = None, *, max_rows: int = 10_000
) -> dict[str, list[dict[str, str]]]:
    """The two tables as lists of rows (first ``max_rows`` rows, like RelServe)."""
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    out: dict[str, list[dict[str, str]]] = {}
    for name, fname in TABLE_FILES.items():
        path = d / fname
        if not path.exists():
            msg = f"table {str(path)!r} not found; pass data_dir= (the folder with {fname})."
            raise InputError(msg)
        with path.open(newline="", encoding="utf-8") as fh:
            rows = []
            for i, row in enumerate(csv.DictReader(fh)):
                if i >= max_rows:
                    break
                rows.append({k: (v or "").strip() for k, v in row.items()})
        out[name] = rows
    return out


def render(instruction: str, fields: Sequence[str], row: dict[str, str]) -> str:
    """Instruction first, then ``name: value`` lines (semframe's prompt layout).

    Examples
    --------
    >>> print(render("Rate it.", ["a", "b"], {"a": "1", "b": "x"}))
    Rate it.
    a: 1
    b: x
    """
    return instruction + "".join(f"\n{f}: {row.get(f, '')}" for f in fields)


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times of a Poisson process with ``rate`` per second, from 0."""
    if rate <= 0:
        msg = f"arrival rate must be > 0; got {rate}."
        raise InputError(msg)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def relserve_workload(
    n_relqueries: int = 100,
    rate: float = 1.0,
    *,
    seed: int = 0,
    max_size: int = 100,
    block_size: int = 16,
    tables: dict[str, list[dict[str, str]]] | None = None,
    arrivals: Sequence[float] | None = None,
) -> list[SimRequest]:
    """A RelServe-shaped stream of relQueries over the real tables.

    Parameters
    ----------
    n_relqueries : int
        relQueries in the stream.
    rate : float
        relQueries per second (Poisson); ignored when ``arrivals`` is given.
    seed : int
        Random seed (tables, tasks, sizes, offsets, output lengths, arrivals).
    max_size : int
        Sizes are uniform in ``1..max_size``.
    block_size : int
        KV block size for the requests' prefix hashes.
    tables : dict, optional
        Preloaded :func:`load_tables` output.
    arrivals : sequence of float, optional
        Trace arrival times (one per relQuery) instead of Poisson.

    Examples
    --------
    >>> reqs = relserve_workload(3, 1.0, seed=1, max_size=4)
    >>> len({r.rel_id for r in reqs}), all(1 <= r.output_len <= r.max_tokens for r in reqs)
    (3, True)
    """
    rng = np.random.default_rng(seed)
    tabs = tables if tables is not None else load_tables()
    names = sorted(tabs)
    times = (
        np.asarray(arrivals, dtype=float)
        if arrivals is not None
        else poisson_arrivals(n_relqueries, rate, rng)
    )
    if len(times) != n_relqueries:
        msg = f"got {len(times)} arrival times for {n_relqueries} relQueries."
        raise InputError(msg)
    out: list[SimRequest] = []
    rid = 0
    for q in range(n_relqueries):
        table = names[int(rng.integers(len(names)))]
        task = TASKS[int(rng.integers(len(TASKS)))]
        _, instruction, fields = next(t for t in task.templates if t[0] == table)
        size = int(rng.integers(1, max_size + 1))
        rows = tabs[table]
        offset = int(rng.integers(len(rows)))
        lo = max(1, math.ceil(task.max_tokens / 2))
        template = f"{task.name}:{table}"
        for k in range(size):
            row = rows[(offset + k) % len(rows)]
            toks = tokenize(render(instruction, fields, row))
            out.append(
                SimRequest(
                    rid,
                    q,
                    size,
                    template,
                    len(toks),
                    task.max_tokens,
                    float(times[q]),
                    block_hashes(toks, block_size),
                    output_len=int(rng.integers(lo, task.max_tokens + 1)),
                )
            )
            rid += 1
    return out


def klpm_workload(
    n: int = 1000,
    rate: float = 10.0,
    *,
    repeats: int = 4,
    base_len: int = 256,
    user_len: int = 2048,
    doc_len: int = 256,
    output_len: int = 8,
    seed: int = 0,
    block_size: int = 16,
) -> list[SimRequest]:
    """k-LPM's queue: shared base prompt, user contexts repeated, unique docs, shuffled.

    Token ids are drawn at random per segment (prefix structure is what matters).
    Each request is its own relQuery of size 1.

    Examples
    --------
    >>> reqs = klpm_workload(8, 5.0, repeats=4, base_len=16, user_len=32, doc_len=16)
    >>> len(reqs), len({r.block_hashes[2] for r in reqs})  # 2 user contexts
    (8, 2)
    """
    if n % repeats:
        msg = f"n ({n}) must be a multiple of repeats ({repeats})."
        raise InputError(msg)
    rng = np.random.default_rng(seed)
    base = rng.integers(VOCAB, size=base_len).tolist()
    users = [rng.integers(VOCAB, size=user_len).tolist() for _ in range(n // repeats)]
    prompts = [
        base + users[i // repeats] + rng.integers(VOCAB, size=doc_len).tolist() for i in range(n)
    ]
    order = rng.permutation(n)
    times = poisson_arrivals(n, rate, rng)
    out = []
    for pos, i in enumerate(order):
        toks = prompts[int(i)]
        out.append(
            SimRequest(
                pos,
                pos,
                1,
                "klpm",
                len(toks),
                output_len,
                float(times[pos]),
                block_hashes(toks, block_size),
                output_len=output_len,
            )
        )
    return out
