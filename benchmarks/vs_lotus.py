"""Head-to-head against LOTUS (``lotus-ai`` 1.2.4): same templates, same servers.

The same filter and map templates over the same slice of ``movies_small.csv``
(the first ``--rows`` reviews with text, in the file's order), run by semframe
and by LOTUS:

1. **Local engine**: the embedded llama.cpp server that semframe's ``local``
   backend starts (SmolLM2-135M-Instruct, ``--parallel`` slots, default engine
   settings). A fresh server for every run, so no run inherits another's
   cache. semframe calls it in process (its ``local`` backend); LOTUS calls
   the same server over its OpenAI-compatible HTTP endpoint with as many
   requests in flight as there are slots. So does ``semframe-http``: semframe
   through its ``openai`` backend pointed at that endpoint, the same way in
   as LOTUS, to separate what the library does from how it reaches the engine.
   Wall time, prompt and cached tokens as the server reported them, and how
   often each library's answers agree with the other's.
2. **Provider emulator** (``semframe.testing.emulator``), cold cache per run: OpenAI
   wire format billed as ``gpt-4o-mini``, and Anthropic wire format billed as
   ``claude-sonnet-4-5``. LOTUS reaches the Anthropic endpoint through
   litellm's own Anthropic client (``anthropic/<model>``); it sends no
   ``cache_control`` breakpoints. Also a ``rubric`` variant of the filter
   (the ~960-token grading rubric of ``benchmarks/api_cost.py`` in the
   template), where provider caches can engage.

LOTUS runs in its own virtual environment (it needs ``pandas<3``,
``numpy<2``) through ``benchmarks/lotus_runner.py``::

    python3 -m venv .venv-lotus && .venv-lotus/bin/pip install lotus-ai==1.2.4
    python benchmarks/vs_lotus.py --rows 100 --repeats 3

Writes ``benchmarks/results/vs_lotus.json``. Without ``.venv-lotus`` it says
so and exits.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

import semframe
from semframe.backends import get_backend, reset_backends
from semframe.testing.emulator import Latency, ProviderEmulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_cost import MOVIE_RUBRIC, movie_examples

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT / ".." / "shared" / "data" / "movies_small.csv").resolve()
RESULTS = ROOT / "benchmarks" / "results" / "vs_lotus.json"
RUNNER = ROOT / "benchmarks" / "lotus_runner.py"
LOTUS_PY = ROOT / ".venv-lotus" / "bin" / "python"

TEMPLATES = {
    "filter": "Is the review {review_content} positive about the movie "
    "{movie_title} ({movie_info})?",
    "map": "Summarize in one short sentence what the review {review_content} says about "
    "the movie {movie_title} ({movie_info}).",
}
# The rubric and six worked examples of benchmarks/api_cost.py, written into the
# template (~1,100 tokens), so that prompts clear the providers' caching minimum.
WORKED = "".join(
    f"\nExample {i}\nMovie description: {e['movie_info']}\nReview: {e['review_content']}\n"
    f"Positive: {e['answer']}\n"
    for i, e in enumerate(movie_examples(), 1)
)
TEMPLATES["filter-rubric"] = (
    MOVIE_RUBRIC
    + WORKED.replace("{", "(").replace("}", ")")
    + "\nNow the review to grade.\nMovie description: {movie_info}\nReview: {review_content}\n"
    + "Is the review positive?"
)
MAX_TOKENS = {"filter": 32, "map": 48, "filter-rubric": 32}
LOCAL_LIBS = ("semframe", "semframe-http", "lotus")
"""On the local engine: semframe in process, semframe over HTTP, LOTUS over HTTP."""
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"


def rows_of(n: int) -> list[int]:
    df = pd.read_csv(DATA)
    keep = df.index[df["review_content"].notna() & (df["review_content"].str.strip() != "")]
    return [int(i) for i in keep[:n]]


def lotus(job: dict[str, Any], python: Path) -> dict[str, Any]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        [str(python), str(RUNNER)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        msg = f"LOTUS runner failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        raise RuntimeError(msg)
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def lotus_local(
    op: str, positions: list[int], url: str, parallel: int, python: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One LOTUS call over the local engine at ``url``: its result, and its token counts."""
    res = lotus(
        {
            "csv": str(DATA),
            "rows": positions,
            "op": op,
            "template": TEMPLATES[op],
            "model": "openai/smollm2-135m",
            "api_base": url + "/v1",
            "api_key": "sk-local",
            "max_batch_size": parallel,
            "max_tokens": MAX_TOKENS[op],
        },
        python,
    )
    counts: dict[str, Any] = {
        key: sum(u.get(key, 0) for u in res["usage"])
        for key in ("prompt_tokens", "cached_tokens", "output_tokens")
    }
    counts["errors"] = sum("error" in u for u in res["usage"])
    return res, counts


def semframe_counts(stats: Any) -> dict[str, Any]:
    """Token counts and errors of a semframe run (``semframe.last_run()``)."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "output_tokens": stats.output_tokens,
        "errors": stats.errors,
    }


def fresh_engine(parallel: int) -> str:
    """A new embedded server (no cache carried over) for the next call; returns its URL."""
    reset_backends("local")
    gc.collect()
    backend: Any = get_backend("local", model=None, settings={"local_parallel": parallel})
    address: str = backend.engine.address
    return address


def semframe_call(df: pd.DataFrame, op: str, **kw: Any) -> tuple[list[Any], float, Any]:
    template = TEMPLATES[op]
    kw.setdefault("cache", False)  # semframe's result cache would answer repeats unsent
    start = time.perf_counter()
    if op.startswith("filter"):
        out = df.llm.filter(template, max_tokens=MAX_TOKENS[op], errors="keep", **kw)
        failed = out["llm_error"].notna() if "llm_error" in out else pd.Series(False, out.index)
        kept, errors = set(out.index[~failed]), set(out.index[failed])
        answers: list[Any] = [None if i in errors else i in kept for i in df.index]
    else:
        # A cut answer is kept, as LOTUS keeps it (by default semframe asks again).
        out = df.llm.map(
            template,
            out="_ans",
            max_tokens=MAX_TOKENS[op],
            errors="keep",
            truncated="keep",
            **kw,
        )
        answers = [None if pd.isna(v) else str(v) for v in out["_ans"]]
    wall = time.perf_counter() - start
    return answers, wall, semframe.last_run()


def norm(text: Any) -> str:
    return " ".join(str(text).lower().split())


def agreement(op: str, a: list[Any], b: list[Any]) -> dict[str, float]:
    pairs = list(zip(a, b, strict=True))
    if op.startswith("filter"):
        return {"same_answer": sum(x == y for x, y in pairs) / len(pairs)}
    return {
        "exact_match": sum(norm(x) == norm(y) for x, y in pairs) / len(pairs),
        "similarity": statistics.mean(
            difflib.SequenceMatcher(None, norm(x), norm(y)).ratio() for x, y in pairs
        ),
    }


def local_runs(args: argparse.Namespace, positions: list[int]) -> list[dict[str, Any]]:
    df = pd.read_csv(DATA).iloc[positions].reset_index(drop=True)
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for op in ("filter", "map"):
            shift = rep % len(LOCAL_LIBS)  # each library goes first in turn
            for lib in LOCAL_LIBS[shift:] + LOCAL_LIBS[:shift]:
                url = fresh_engine(args.parallel)
                if lib.startswith("semframe"):
                    where: dict[str, Any] = (
                        {"backend": "local", "local_parallel": args.parallel}
                        if lib == "semframe"
                        else {
                            "backend": "openai",
                            "base_url": url + "/v1",
                            "model": "smollm2-135m",
                            "max_concurrency": args.parallel,
                        }
                    )
                    answers, wall, st = semframe_call(df, op, progress="off", **where)
                    run = semframe_counts(st)
                else:
                    res, run = lotus_local(op, positions, url, args.parallel, args.lotus_python)
                    answers, wall = res["answers"], res["wall_s"]
                    run |= {
                        "fields": res["fields"],
                        "first_request": res["first_request"],
                    }
                    if op == "filter":
                        run["unparsed_defaulted_true"] = sum(
                            "true" not in r.lower() and "false" not in r.lower() for r in res["raw"]
                        )
                run.update({"server": "local", "op": op, "lib": lib, "rep": rep, "wall_s": wall})
                run["answers"] = answers
                runs.append(run)
                print(
                    f"  local {op:<6} {lib:<13} rep {rep}: {wall:7.1f} s, prompt "
                    f"{run['prompt_tokens']:,}, cached {run['cached_tokens']:,}",
                    flush=True,
                )
    reset_backends("local")
    gc.collect()
    return runs


def emulator_runs(args: argparse.Namespace, positions: list[int]) -> list[dict[str, Any]]:
    df = pd.read_csv(DATA).iloc[positions].reset_index(drop=True)
    runs: list[dict[str, Any]] = []
    with ProviderEmulator(latency=Latency(0)) as emu:  # instant, as documented
        for op in ("filter", "map", "filter-rubric"):
            for provider, model in (("openai", OPENAI_MODEL), ("anthropic", ANTHROPIC_MODEL)):
                url = emu.openai_url if provider == "openai" else emu.anthropic_url
                for lib in ("semframe", "lotus"):
                    emu.reset()
                    if lib == "semframe":
                        _, wall, _ = semframe_call(
                            df, op, backend=provider, base_url=url, model=model, progress="off"
                        )
                    else:
                        res = lotus(
                            {
                                "csv": str(DATA),
                                "rows": positions,
                                "op": "map" if op == "map" else "filter",
                                "template": TEMPLATES[op],
                                "model": f"{provider}/{model}",
                                "api_base": url,
                                "api_key": "sk-emulator",
                                "max_batch_size": 64,
                                "max_tokens": MAX_TOKENS[op],
                            },
                            args.lotus_python,
                        )
                        wall = res["wall_s"]
                    bill = emu.ledger.totals()
                    run = {
                        "server": f"emulator/{provider}",
                        "model": model,
                        "op": op,
                        "lib": lib,
                        "wall_s": wall,
                        "requests": bill.requests,
                        "prompt_tokens": bill.prompt_tokens,
                        "cached_tokens": bill.cached_tokens,
                        "cache_write_tokens": bill.cache_write_tokens,
                        "output_tokens": bill.output_tokens,
                        "input_dollars": bill.cost.uncached_input
                        + bill.cost.cached_input
                        + bill.cost.cache_writes,
                        "dollars": bill.dollars,
                    }
                    runs.append(run)
                    print(
                        f"  {run['server']:<18} {op:<13} {lib:<8} prompt {bill.prompt_tokens:,}, "
                        f"cached {bill.cached_tokens:,}, input ${run['input_dollars']:.4f}",
                        flush=True,
                    )
    return runs


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(local_rs: list[dict[str, Any]], emu_rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for op in ("filter", "map", "filter-rubric"):
        for lib in LOCAL_LIBS:
            row: dict[str, Any] = {"op": op, "lib": lib}
            mine = [r for r in local_rs if r["op"] == op and r["lib"] == lib]
            if mine:
                row["local_wall_s"] = med(mine, "wall_s")
                row["local_wall_s_all"] = [round(r["wall_s"], 1) for r in mine]
                row["local_prompt_tokens"] = int(med(mine, "prompt_tokens"))
                row["local_cached_share"] = statistics.median(
                    r["cached_tokens"] / r["prompt_tokens"] for r in mine if r["prompt_tokens"]
                )
                row["local_cached_share_all"] = [
                    round(r["cached_tokens"] / r["prompt_tokens"], 3) for r in mine
                ]
                # Answers against the other library's in the same repeat (LOTUS: semframe's).
                other = "semframe" if lib == "lotus" else "lotus"
                ours = [r for r in local_rs if r["op"] == op and r["lib"] == lib]
                theirs = [r for r in local_rs if r["op"] == op and r["lib"] == other]
                agree = [
                    agreement(op, a["answers"], b["answers"])
                    for a, b in zip(ours, theirs, strict=False)
                ]
                if agree:
                    row["agreement"] = {k: statistics.median(x[k] for x in agree) for k in agree[0]}
                row["local_output_tokens"] = int(med(mine, "output_tokens"))
                if op == "filter":
                    row["yes_share"] = statistics.median(
                        sum(v is True for v in r["answers"]) / len(r["answers"]) for r in mine
                    )
            for provider in ("openai", "anthropic"):
                bill = [
                    r
                    for r in emu_rs
                    if r["op"] == op and r["lib"] == lib and r["server"] == f"emulator/{provider}"
                ]
                if bill:
                    b = bill[0]
                    row[f"{provider}_prompt_tokens"] = b["prompt_tokens"]
                    row[f"{provider}_cached_tokens"] = b["cached_tokens"]
                    row[f"{provider}_cache_write_tokens"] = b["cache_write_tokens"]
                    row[f"{provider}_input_dollars"] = b["input_dollars"]
                    row[f"{provider}_dollars"] = b["dollars"]
            rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    def pct(x: Any) -> str:
        return "-" if x is None else f"{x:.1%}"

    def num(x: Any, fmt: str = ",") -> str:
        return "-" if x is None else format(x, fmt)

    head = (
        f"{'op':<13} {'library':<13} {'wall s':>7} {'prompt':>8} {'cached':>7} {'agree':>6} "
        f"{'OAI prompt':>10} {'OAI cached':>10} {'OAI in $':>9} {'ANT prompt':>10} "
        f"{'ANT cached':>10} {'ANT in $':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        agree = r.get("agreement", {})
        a = agree.get("same_answer", agree.get("similarity"))
        print(
            f"{r['op']:<13} {r['lib']:<13} {num(r.get('local_wall_s'), '.1f'):>7} "
            f"{num(r.get('local_prompt_tokens')):>8} {pct(r.get('local_cached_share')):>7} "
            f"{pct(a) if a is not None else '-':>6} "
            f"{num(r.get('openai_prompt_tokens')):>10} {num(r.get('openai_cached_tokens')):>10} "
            f"{num(r.get('openai_input_dollars'), '.4f'):>9} "
            f"{num(r.get('anthropic_prompt_tokens')):>10} "
            f"{num(r.get('anthropic_cached_tokens')):>10} "
            f"{num(r.get('anthropic_input_dollars'), '.4f'):>9}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="local runs per library and op")
    parser.add_argument("--parallel", type=int, default=4, help="engine slots")
    parser.add_argument("--lotus-python", type=Path, default=LOTUS_PY)
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not args.lotus_python.exists():
        print(
            f"skipped: no LOTUS environment at {args.lotus_python}. Create it with\n"
            "  python3 -m venv .venv-lotus && .venv-lotus/bin/pip install lotus-ai==1.2.4"
        )
        return
    os.environ.setdefault("OPENAI_API_KEY", "sk-emulator")
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-emulator")
    warnings.simplefilter("ignore", DeprecationWarning)
    positions = rows_of(args.rows)
    print(f"{len(positions)} reviews from {DATA.name}; LOTUS from {args.lotus_python}")
    emu_rs = [] if args.skip_emulator else emulator_runs(args, positions)
    local_rs = [] if args.skip_local else local_runs(args, positions)
    rows = summarize(local_rs, emu_rs)
    print()
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "vs_lotus",
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "machine": f"{platform.platform()}, {os.cpu_count()} cores",
                "command": "python benchmarks/vs_lotus.py " + " ".join(sys.argv[1:]),
                "rows": len(positions),
                "row_positions": positions,
                "parallel": args.parallel,
                "templates": TEMPLATES,
                "max_tokens": MAX_TOKENS,
                "models": {
                    "local": "smollm2-135m",
                    "openai": OPENAI_MODEL,
                    "anthropic": ANTHROPIC_MODEL,
                },
                "summary": rows,
                "local_runs": local_rs,
                "emulator_runs": emu_rs,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
