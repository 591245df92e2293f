"""``semframe serve``: a vLLM OpenAI-compatible server with our scheduler.

For several users or jobs sharing one GPU: the server admits requests with a
semframe policy (RelServe by default), and clients connect with
``backend="vllm", base_url="http://host:port/v1", model=<name>``; their
requests carry the relQuery tags in ``vllm_xargs``, so the scheduler knows
which requests form one relQuery.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semframe.serving.sched.policies import Policy
from semframe.serving.vllm import SCHEDULER_CLS, has_gpu, require_vllm
from semframe.serving.vllm.convert import model_dir

SERVE_POLICIES = ("relserve", "k-lpm", "lpm", "static", "fcfs")
"""Policies ``semframe serve --scheduler`` accepts."""


@dataclass(frozen=True)
class ServerCommand:
    """What ``semframe serve`` runs: the argument vector and the environment additions."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def server_command(
    model_path: str | Path,
    *,
    served_name: str,
    scheduler: str = "relserve",
    host: str = "127.0.0.1",
    port: int = 8000,
    gpu: bool = False,
    kv_cache_gib: float | None = None,
    max_model_len: int | None = None,
    options: Mapping[str, Any] | None = None,
    trace: str | None = None,
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> ServerCommand:
    """The vLLM server command for ``model_path`` with our scheduler.

    Parameters
    ----------
    model_path : str or Path
        A Hugging Face model directory.
    served_name : str
        The model name clients send.
    scheduler : str
        Our scheduler's policy.
    gpu : bool
        False adds the CPU build's settings (``--enforce-eager``; KV cache size
        from ``kv_cache_gib`` through ``VLLM_CPU_KVCACHE_SPACE``).
    options : mapping, optional
        The policy's options (``{"k": 4}``, a calibrated ``cost``, ...).
    trace : str, optional
        File the scheduler appends one JSON line per step to.
    extra : sequence of str
        More server arguments, passed through.

    Examples
    --------
    >>> cmd = server_command("/m", served_name="smollm2-135m", scheduler="k-lpm", port=9000)
    >>> cmd.argv[1:3], "--enable-prompt-tokens-details" in cmd.argv
    (('-m', 'vllm.entrypoints.openai.api_server'), True)
    >>> json.loads(cmd.argv[cmd.argv.index("--additional-config") + 1])
    {'semframe': {'policy': 'k-lpm'}}
    >>> server_command("/m", served_name="m", scheduler="sjf")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    semframe.errors.ConfigError: unknown scheduling policy 'sjf'; valid: ...
    """
    Policy.parse(scheduler)
    ours: dict[str, Any] = {"policy": scheduler}
    if options:
        ours.update(options)
    if trace:
        ours["trace"] = str(trace)
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_path),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--scheduler-cls",
        SCHEDULER_CLS,
        "--additional-config",
        json.dumps({"semframe": ours}),
    ]
    env: dict[str, str] = {}
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if not gpu:
        argv.append("--enforce-eager")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(math.ceil(kv_cache_gib or 2))  # whole GiB
    elif kv_cache_gib:
        argv += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    argv += list(extra)
    env["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE", "1")
    return ServerCommand(tuple(argv), env)


def serve(args: Any) -> int:
    """Run the server in place of this process (``semframe serve``)."""
    require_vllm()
    options: dict[str, Any] = {}
    if args.k is not None:
        options["options"] = {"k": args.k}
    if args.cost:  # a Calibration's JSON, or an engine model's (calibrate_vllm) holding one
        data = json.loads(Path(args.cost).read_text(encoding="utf-8"))
        options["cost"] = data.get("calibration", data)["relserve"]
    cmd = server_command(
        model_dir(args.model),
        served_name=args.served_name or args.model,
        scheduler=args.scheduler,
        host=args.host,
        port=args.port,
        gpu=has_gpu(),
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        options=options,
        trace=args.trace,
        extra=args.vllm_arg or (),
    )
    print("semframe serve:", " ".join(cmd.argv[1:]), flush=True)
    env = {**os.environ, **cmd.env}
    os.execve(cmd.argv[0], list(cmd.argv), env)
