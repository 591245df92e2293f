"""Run one LOTUS operator call for ``benchmarks/vs_lotus.py``; not part of semframe.

This script runs under the LOTUS environment's interpreter (``.venv-lotus``:
``lotus-ai`` 1.2.4 needs ``pandas<3`` and ``numpy<2``), never under semframe's.
It reads a JSON job on stdin, makes one ``sem_filter`` or ``sem_map`` call
through ``lotus.models.LM`` (litellm) against ``api_base``, and prints one JSON
object on stdout: wall seconds of the call, the answers in row order, the usage
of every response, the field order LOTUS used, and the first request's messages.

Job keys: ``csv``, ``rows`` (row positions to keep), ``op`` (``filter`` or
``map``), ``template``, ``model`` (a litellm model name such as
``openai/gpt-4o-mini``), ``api_base``, ``api_key``, ``max_batch_size``,
``max_tokens``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def main() -> None:
    job = json.load(sys.stdin)
    import lotus
    import lotus.models.lm as lotus_lm
    import pandas as pd
    from lotus.models import LM

    usage: list[dict[str, Any]] = []
    first: list[Any] = []
    original = lotus_lm.batch_completion

    def recording(model: str, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
        if not first and messages:
            first.append(messages[0])
        responses = original(model, messages, *args, **kwargs)
        for r in responses:
            u = getattr(r, "usage", None)
            if u is None:
                usage.append({"error": repr(r)[:300]})
                continue
            details = getattr(u, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            usage.append(
                {
                    "prompt_tokens": int(u.prompt_tokens or 0),
                    "cached_tokens": int(cached or 0),
                    "output_tokens": int(u.completion_tokens or 0),
                }
            )
        return responses

    lotus_lm.batch_completion = recording  # type: ignore[assignment]

    df = pd.read_csv(job["csv"]).iloc[job["rows"]].reset_index(drop=True)
    lm = LM(
        model=job["model"],
        api_base=job["api_base"],
        api_key=job.get("api_key", "sk-local"),
        max_batch_size=int(job["max_batch_size"]),
        max_tokens=int(job["max_tokens"]),
        temperature=0.0,
    )
    lotus.settings.configure(lm=lm, enable_cache=False)
    # LOTUS collects a template's columns through a set: the order differs between
    # processes (string hashing is salted per process). Record what this one used.
    fields = lotus.nl_expression.parse_cols(job["template"])

    start = time.perf_counter()
    if job["op"] == "filter":
        out = df.sem_filter(
            job["template"], return_all=True, return_raw_outputs=True, progress_bar_desc="lotus"
        )
        wall = time.perf_counter() - start
        answers: list[Any] = [bool(v) for v in out["_filter"]]
        raw = [str(v) for v in out["raw_output_filter"]]
    else:
        out = df.sem_map(job["template"], progress_bar_desc="lotus")
        wall = time.perf_counter() - start
        answers = [str(v) for v in out["_map"]]
        raw = answers
    json.dump(
        {
            "wall_s": wall,
            "answers": answers,
            "raw": raw,
            "usage": usage,
            "fields": fields,
            "first_request": first[0] if first else None,
            "lotus_version": getattr(lotus, "__version__", "1.2.4"),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
