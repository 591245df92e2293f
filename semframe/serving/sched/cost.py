"""Batch cost models: InferMax's linear model and RelServe's simple predictors.

**InferMax** (``infermax-cost-aware-scheduling``, section 3.2): a batch's time is
the sum of

- a per-batch overhead (loading the weights, launching kernels): ``overhead``;
- non-attention operators, linear in tokens processed ``sum c``: ``per_token``;
- prefill attention, linear in ``sum (c^2 + 2 m c)`` over prefilling requests
  (``c`` new tokens on top of ``m`` already in the KV cache; chunked prefill
  makes ``m > 0``): ``prefill_attn``;
- prefill KV reads, linear in ``sum m`` over prefilling requests: ``prefill_kv``;
- a per-prefill-request term (one thread-block wave per request): ``per_prefill``;
- decode attention, linear in the KV read ``sum m`` over decoding requests:
  ``decode_kv``.

**RelServe** (``relserve-relquery-scheduling``, eq. 9): a prefill batch takes
``alpha_p * utok + beta_p`` (``utok``: tokens *not* found in the prefix cache)
and a decode batch ``alpha_d * req + beta_d`` (``req``: requests decoding).
RelServe's scheduler uses these to estimate relQuery durations.

Both are fitted by least squares from measured batch timings
(:func:`fit_infermax`, :func:`fit_relserve`); :func:`calibrate` runs a
profiling sweep through a caller-supplied function that executes one batch on a
real engine and returns its seconds, fits both models and stores them as JSON.

Shipped defaults (:data:`A100_13B`) are **not measured here** (no GPU on the
development machine): they are a roofline estimate for a 13B model with
40 layers and hidden size 5120 (OPT-13B / Llama-2-13B, the RelServe paper's
main model) on one A100-80GB (312 TFLOPS bf16, 2.0 TB/s), with assumed
efficiencies: weights (26 GB) read once per batch at 80% of bandwidth plus
4 ms of launch/sampling overhead; 2 x 13e9 FLOPs per token at 60% of peak;
prefill attention 2 x 40 x 5120 FLOPs per unit of ``c^2 + 2mc`` at 50%;
KV reads of 800 KB per token at 80% of bandwidth. The papers publish plots of
these fits but not their coefficients. :data:`RELSERVE_A100_13B` is RelServe's
predictor fitted (with :func:`fit_relserve`) to batches timed by
:data:`A100_13B`, so the scheduler's estimates and the simulated engine agree
the way they would after calibrating on one engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from semframe.errors import InputError, MissingDependencyError


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What determines a batch's time: per-request new tokens and context.

    Attributes
    ----------
    prefill : tuple of (int, int)
        ``(c, m)`` per prefilling request: new tokens, tokens already cached.
    decode : tuple of int
        KV tokens read per decoding request (each computes one new token).
    uncached : int or None
        Prefill tokens not found in the prefix cache; defaults to ``sum c``.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()
    uncached: int | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens processed: prefill chunks plus one per decoding request."""
        return sum(c for c, _ in self.prefill) + len(self.decode)

    def features(self) -> tuple[float, float, float, float, float, float]:
        """InferMax regressors: 1, sum c, sum c^2+2mc, prefill sum m, #prefill, decode sum m."""
        sc = float(sum(c for c, _ in self.prefill) + len(self.decode))
        attn = float(sum(c * c + 2 * m * c for c, m in self.prefill))
        pkv = float(sum(m for _, m in self.prefill))
        return (1.0, sc, attn, pkv, float(len(self.prefill)), float(sum(self.decode)))


@dataclass(frozen=True, slots=True)
class InferMaxCost:
    """InferMax's linear batch-time model (seconds).

    Examples
    --------
    >>> model = InferMaxCost(overhead=0.02, per_token=1e-4)
    >>> round(model.batch_time(BatchShape(prefill=((100, 0),))), 6)
    0.03
    """

    overhead: float = 0.0
    per_token: float = 0.0
    prefill_attn: float = 0.0
    prefill_kv: float = 0.0
    per_prefill: float = 0.0
    decode_kv: float = 0.0

    def coefficients(self) -> tuple[float, float, float, float, float, float]:
        """Coefficients in :meth:`BatchShape.features` order."""
        return (
            self.overhead,
            self.per_token,
            self.prefill_attn,
            self.prefill_kv,
            self.per_prefill,
            self.decode_kv,
        )

    def batch_time(self, shape: BatchShape) -> float:
        """Predicted seconds for one batch (0 for an empty batch)."""
        if not shape.prefill and not shape.decode:
            return 0.0
        return float(sum(a * b for a, b in zip(self.coefficients(), shape.features(), strict=True)))

    def time_from_sums(
        self, num_tokens: int, attn: int, prefill_kv: int, n_prefill: int, decode_kv: int
    ) -> float:
        """:meth:`batch_time` from precomputed sums (the simulator's fast path)."""
        if num_tokens == 0:
            return 0.0
        return (
            self.overhead
            + self.per_token * num_tokens
            + self.prefill_attn * attn
            + self.prefill_kv * prefill_kv
            + self.per_prefill * n_prefill
            + self.decode_kv * decode_kv
        )


@dataclass(frozen=True, slots=True)
class RelServeCost:
    """RelServe's predictors (eq. 9): prefill by uncached tokens, decode by batch size.

    Examples
    --------
    >>> rs = RelServeCost(alpha_p=1e-4, beta_p=0.02, alpha_d=1e-4, beta_d=0.02)
    >>> round(rs.prefill_time(1000), 6), round(rs.decode_time(10), 6)
    (0.12, 0.021)
    """

    alpha_p: float
    beta_p: float
    alpha_d: float
    beta_d: float

    def prefill_time(self, uncached_tokens: float) -> float:
        """``L^prefill(p) = alpha_p * utok(p) + beta_p``."""
        return self.alpha_p * uncached_tokens + self.beta_p

    def decode_time(self, num_requests: float) -> float:
        """``L^decode(d) = alpha_d * req(d) + beta_d``."""
        return self.alpha_d * num_requests + self.beta_d


A100_13B = InferMaxCost(
    overhead=26e9 / (2.0e12 * 0.8) + 0.004,  # weights once per batch + launch/sampling
    per_token=2 * 13e9 / (312e12 * 0.6),  # matmul FLOPs per token
    prefill_attn=2 * 40 * 5120 / (312e12 * 0.5),  # FLOPs per unit of c^2 + 2mc
    prefill_kv=800e3 / (2.0e12 * 0.8),  # chunked prefill reads earlier chunks' KV
    per_prefill=5e-5,  # one attention wave per prefill request (assumed)
    decode_kv=800e3 / (2.0e12 * 0.8),  # 800 KB of KV per token read per decode
)
"""Roofline defaults for a 13B model on one A100 (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured batch: its shape and seconds."""

    shape: BatchShape
    seconds: float


def _lstsq(x: np.ndarray, y: np.ndarray, *, nonneg: bool) -> np.ndarray:
    if nonneg:
        try:
            from scipy.optimize import nnls
        except ImportError:
            msg = "a non-negative fit needs SciPy: pip install 'semframe[sched]'"
            raise MissingDependencyError(msg) from None

        coef, _ = nnls(x, y)
        return np.asarray(coef, dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return np.asarray(coef, dtype=float)


def fit_infermax(samples: Sequence[Sample], *, nonneg: bool = True) -> InferMaxCost:
    """Least-squares fit of :class:`InferMaxCost` to measured batches.

    Regressors whose column is all zero in ``samples`` get coefficient 0.
    ``nonneg`` constrains coefficients to be >= 0 (times cannot be negative).

    Examples
    --------
    >>> true = InferMaxCost(0.02, 1e-4, 3e-9, 4e-7, 5e-5, 5e-7)
    >>> shapes = [BatchShape(prefill=((c, m),)) for c in (64, 512, 2048) for m in (0, 1000)]
    >>> shapes += [BatchShape(decode=(m,) * b) for b in (1, 64, 256) for m in (100, 900)]
    >>> shapes += [BatchShape(prefill=((100, 0),) * 8)]
    >>> fit = fit_infermax([Sample(s, true.batch_time(s)) for s in shapes])
    >>> [round(a / b, 3) for a, b in zip(fit.coefficients(), true.coefficients())]
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    if not samples:
        msg = "fit_infermax needs at least one measured batch; got none."
        raise InputError(msg)
    x = np.array([s.shape.features() for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    used = np.flatnonzero(np.any(x != 0, axis=0))
    scale = np.abs(x[:, used]).max(axis=0)
    coef = _lstsq(x[:, used] / scale, y, nonneg=nonneg) / scale
    full = np.zeros(x.shape[1])
    full[used] = coef
    return InferMaxCost(*(float(v) for v in full))


def fit_relserve(samples: Sequence[Sample]) -> RelServeCost:
    """Least-squares fit of RelServe's two lines; prefill and decode batches separately.

    Prefill batches (any prefill request) regress on uncached tokens; pure decode
    batches on the number of requests.

    Examples
    --------
    >>> pre = [Sample(BatchShape(prefill=((t, 0),)), 1e-4 * t + 0.02) for t in (10, 500, 4000)]
    >>> dec = [Sample(BatchShape(decode=(50,) * b), 2e-4 * b + 0.021) for b in (1, 100, 256)]
    >>> rs = fit_relserve(pre + dec)
    >>> [round(v, 6) for v in (rs.alpha_p, rs.beta_p, rs.alpha_d, rs.beta_d)]
    [0.0001, 0.02, 0.0002, 0.021]
    """
    pre = [s for s in samples if s.shape.prefill]
    dec = [s for s in samples if not s.shape.prefill and s.shape.decode]
    if len(pre) < 2 or len(dec) < 2:
        msg = (
            f"fit_relserve needs >= 2 prefill and >= 2 decode batches; "
            f"got {len(pre)} prefill and {len(dec)} decode."
        )
        raise InputError(msg)

    def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
        a = np.column_stack([np.asarray(xs), np.ones(len(xs))])
        (slope, icpt), *_ = np.linalg.lstsq(a, np.asarray(ys), rcond=None)
        return float(slope), float(icpt)

    ap, bp = line(
        [
            float(s.shape.uncached if s.shape.uncached is not None else s.shape.num_tokens)
            for s in pre
        ],
        [s.seconds for s in pre],
    )
    ad, bd = line([float(len(s.shape.decode)) for s in dec], [s.seconds for s in dec])
    return RelServeCost(alpha_p=ap, beta_p=bp, alpha_d=ad, beta_d=bd)


def profile_shapes(
    *, max_tokens: int = 4096, max_seqs: int = 256, max_context: int = 2048
) -> list[BatchShape]:
    """A profiling sweep: prefill sizes x cached context x batch sizes, decode sizes x KV.

    Examples
    --------
    >>> shapes = profile_shapes(max_tokens=512, max_seqs=8, max_context=256)
    >>> len(shapes) > 10, all(s.num_tokens <= 512 for s in shapes)
    (True, True)
    """
    shapes: list[BatchShape] = []
    sizes = sorted({min(max_tokens, 2**k) for k in range(4, 1 + int(math.log2(max_tokens)))})
    contexts = sorted({0, max_context // 4, max_context})
    for c in sizes:
        for m in contexts:
            for n in (1, 4):
                if n * c <= max_tokens:
                    uncached = n * c
                    shapes.append(BatchShape(prefill=((c, m),) * n, uncached=uncached))
    batches = sorted({min(max_seqs, 2**k) for k in range(1 + int(math.log2(max_seqs)))})
    for b in batches:
        for m in (max(1, max_context // 16), max_context // 2, max_context):
            shapes.append(BatchShape(decode=(m,) * b))
    return shapes


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted engine: both models, how many batches, relative fit error.

    Attributes
    ----------
    infermax : InferMaxCost
    relserve : RelServeCost
    num_samples : int
    mean_rel_error : float
        Mean ``|predicted - measured| / measured`` of the InferMax fit.
    source : str
        Where the timings came from.
    """

    infermax: InferMaxCost
    relserve: RelServeCost
    num_samples: int
    mean_rel_error: float
    source: str

    def to_json(self) -> str:
        """JSON text (see :meth:`from_json`)."""
        return json.dumps(
            {
                "source": self.source,
                "num_samples": self.num_samples,
                "mean_rel_error": self.mean_rel_error,
                "infermax": asdict(self.infermax),
                "relserve": asdict(self.relserve),
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        """Read what :meth:`to_json` wrote."""
        d = json.loads(text)
        return cls(
            infermax=InferMaxCost(**d["infermax"]),
            relserve=RelServeCost(**d["relserve"]),
            num_samples=int(d["num_samples"]),
            mean_rel_error=float(d["mean_rel_error"]),
            source=str(d["source"]),
        )


def calibrate(
    run_batch: Callable[[BatchShape], float],
    *,
    shapes: Iterable[BatchShape] | None = None,
    repeats: int = 3,
    path: str | Path | None = None,
    source: str = "engine",
) -> Calibration:
    """Profile an engine, fit both cost models, optionally store the fit as JSON.

    Parameters
    ----------
    run_batch : callable
        Runs one batch of the given shape on a real engine (random prompts of
        those lengths, ``m`` tokens of each already cached) and returns its
        seconds.
    shapes : iterable of BatchShape, optional
        The sweep; defaults to :func:`profile_shapes`.
    repeats : int
        Timings per shape; the median is used.
    path : str or Path, optional
        Where to write the JSON.
    source : str
        Recorded in the JSON (engine, model, GPU).

    Examples
    --------
    >>> cal = calibrate(A100_13B.batch_time, repeats=1, source="roofline")
    >>> cal.mean_rel_error < 1e-6
    True
    """
    shapes = list(shapes) if shapes is not None else profile_shapes()
    samples = [
        Sample(s, float(np.median([run_batch(s) for _ in range(max(1, repeats))]))) for s in shapes
    ]
    infer = fit_infermax(samples)
    rel = fit_relserve(samples)
    errs = [abs(infer.batch_time(s.shape) - s.seconds) / s.seconds for s in samples if s.seconds]
    cal = Calibration(infer, rel, len(samples), float(np.mean(errs)) if errs else 0.0, source)
    if path is not None:
        Path(path).write_text(cal.to_json() + "\n", encoding="utf-8")
    return cal


def relserve_from(model: InferMaxCost, *, context: int = 200) -> RelServeCost:
    """RelServe's predictor fitted to batches timed by ``model`` (typical context).

    Examples
    --------
    >>> rs = relserve_from(A100_13B)
    >>> rs.alpha_p > 0 and rs.beta_d > 0
    True
    """
    shapes = [BatchShape(prefill=((c, 0),) * n) for c in (32, 128, 256) for n in (1, 4, 16)]
    shapes += [BatchShape(decode=(context,) * b) for b in (1, 8, 32, 64, 128, 256)]
    return fit_relserve([Sample(s, model.batch_time(s)) for s in shapes])


RELSERVE_A100_13B = relserve_from(A100_13B)
"""RelServe's predictors fitted to :data:`A100_13B` batches (200-token context)."""
