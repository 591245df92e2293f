"""``backend="vllm"``: vLLM in this process, or a running vLLM server (``base_url``).

**In process** (no ``base_url``): semframe starts vLLM's async engine
(``AsyncLLM``) with prefix caching on and our scheduler
(:class:`semframe.serving.vllm.scheduler.SemframeScheduler`, policy from the
``vllm_scheduler`` setting) in place of vLLM's, the first time a request is
sent; it is reused by later calls with the same settings. Requests are
submitted in the planned (GGR) order, each tagged with its relQuery's identity
and size (``SamplingParams.extra_args``), so the scheduler can order
admissions by relQuery. Answers carry the engine's own counts: prompt tokens,
``num_cached_tokens`` (prefix-cache hits, block-granular) and output tokens.
``filter``/``classify``/``extract`` constrain decoding with vLLM's structured
outputs (a JSON schema), and token logprobs come from the engine.

vLLM's engine runs in a spawned process: a script that uses this backend
needs an ``if __name__ == "__main__":`` guard.

**Server** (``base_url="http://host:8000/v1"``): a vLLM OpenAI-compatible
server, e.g. one started by ``semframe serve`` (several users or jobs sharing
one GPU). This reuses the OpenAI backend's machinery (async client, retries,
rate limits) and sends the relQuery tags in the body's ``vllm_xargs``; cached
tokens come from ``usage.prompt_tokens_details`` (the server needs
``--enable-prompt-tokens-details``, which ``semframe serve`` sets).

Models: ``smollm2-135m`` (the default; converted once from the pip-installed
GGUF, see :mod:`semframe.serving.vllm.convert`) or the path of a Hugging Face model
directory. Engine arguments (``max_model_len``, ``gpu_memory_utilization``,
``enforce_eager``, ...) go in the ``vllm_args`` setting.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import logging
import os
import platform
import random
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from semframe.backends import aio as _aio
from semframe.backends.base import Capabilities
from semframe.backends.openai import MAX_CONCURRENCY, OpenAIBackend
from semframe.config import cache_dir
from semframe.core.wire import Completion, Request, TokenLogprob, Usage
from semframe.cost.models import BlockCost, SlotCost
from semframe.errors import ConfigError, RequestRejected, RunAborted, TransientError
from semframe.serving.sched.policies import Policy
from semframe.serving.vllm import SCHEDULER_CLS, has_gpu, require_vllm
from semframe.serving.vllm.convert import model_dir
from semframe.serving.vllm.timing import EngineModel, load_engine_model, store_engine_model
from semframe.serving.vllm.trace import calibrate_from_trace

DEFAULT_MODEL = "smollm2-135m"

_SHUT_DOWN: list[Any] = []
"""Engines already shut down, kept so that their finalizers run only at exit."""

_CPU_DEFAULTS: dict[str, Any] = {"enforce_eager": True, "max_model_len": 4096}
"""Engine arguments on a machine without a GPU (compiling takes minutes per start)."""


def rel_tags(request: Request) -> dict[str, Any]:
    """The relQuery tags a request carries to our scheduler.

    Examples
    --------
    >>> r = Request(0, 0, "p", None, 8, 0.0, None, 0, rel="ab12", rel_size=40)
    >>> rel_tags(r)
    {'semframe_rel': 'ab12', 'semframe_rel_size': 40}
    """
    return {"semframe_rel": request.rel, "semframe_rel_size": max(1, request.rel_size)}


def engine_args(
    model_path: str,
    *,
    scheduler: str,
    extra: Mapping[str, Any] | None = None,
    gpu: bool | None = None,
) -> dict[str, Any]:
    """Engine arguments for our scheduler, prefix caching on.

    ``extra`` (the ``vllm_args`` setting) wins over the defaults, except that
    prefix caching stays on and ``scheduler_cls`` stays ours; our scheduler's
    own options merge into ``additional_config["semframe"]``.

    Examples
    --------
    >>> a = engine_args("/m", scheduler="k-lpm", extra={"max_model_len": 2048}, gpu=False)
    >>> a["enable_prefix_caching"], a["max_model_len"], a["additional_config"]["semframe"]["policy"]
    (True, 2048, 'k-lpm')
    """
    Policy.parse(scheduler)  # a clear error for an unknown policy, before starting anything
    args: dict[str, Any] = {"model": model_path}
    if gpu is None:
        gpu = has_gpu()
    if not gpu:
        args.update(_CPU_DEFAULTS)
    extra = dict(extra or {})
    additional = dict(extra.pop("additional_config", None) or {})
    ours = {"policy": scheduler, **dict(additional.get("semframe") or {})}
    ours["policy"] = scheduler
    additional["semframe"] = ours
    args.update(extra)
    args["enable_prefix_caching"] = True
    args["scheduler_cls"] = SCHEDULER_CLS
    args["additional_config"] = additional
    return args


def engine_cost(
    model: str,
    count_tokens: Callable[[Sequence[str]], list[int]],
    args: Mapping[str, Any],
    *,
    concurrency: int,
    framing: Callable[[str | None], tuple[int, int]] | None = None,
) -> BlockCost:
    """The cost model of an in-process engine run with engine arguments ``args``.

    Its cache blocks are ``block_size`` tokens (vLLM's default: 16, 128 with
    ``enforce_eager`` on the CPU build), ``num_gpu_blocks_override`` of them
    when set (its capacity); an engine model stored by
    :func:`calibrate_vllm` for ``model`` in the
    cache directory makes the estimate a replay on the simulator.
    """
    block = int(args.get("block_size") or (128 if args.get("enforce_eager") else 16))
    blocks = args.get("num_gpu_blocks_override")
    return BlockCost(
        model,
        count_tokens,
        concurrency,
        engine="vllm",
        block_size=block,
        framing=framing,
        engine_model=lambda directory: load_engine_model(directory, model),
        num_blocks=int(blocks) if blocks else None,
    )


class VllmBackend:
    """vLLM's async engine in this process, with our scheduler (module docs).

    Parameters
    ----------
    model : str
        ``smollm2-135m`` or a Hugging Face model directory.
    scheduler : str
        Our scheduler's policy (``relserve``, ``k-lpm``, ``fcfs``, ...).
    vllm_args : mapping, optional
        Engine arguments (``AsyncEngineArgs`` fields).
    max_concurrency : int
        Requests submitted to the engine at once (its scheduler decides which run).
    """

    name = "vllm"
    endpoint = None

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        scheduler: str = "relserve",
        vllm_args: Mapping[str, Any] | None = None,
        max_concurrency: int = MAX_CONCURRENCY,
        models_dir: Path | None = None,
    ) -> None:
        require_vllm()
        self.model = model
        self.scheduler = scheduler
        path = model_dir(model, root=models_dir)
        self.model_path = str(path)
        self.engine_args = engine_args(self.model_path, scheduler=scheduler, extra=vllm_args)
        window = self.engine_args.get("max_model_len")
        self.capabilities = Capabilities(
            prefix_cache="shared",
            json_schema=True,
            logprobs=True,
            max_concurrency=max_concurrency,
            context_window=int(window) if window else _model_window(path),
            relquery_aware=True,
            async_io=True,
        )
        self.cost = engine_cost(
            model,
            self.count_tokens,
            self.engine_args,
            concurrency=max_concurrency,
            framing=self.framing_tokens,
        )
        self._engine: Any = None
        self._tokenizer: Any = None
        self._start_lock = threading.Lock()
        self._ids = itertools.count()

    def __repr__(self) -> str:
        return f"VllmBackend(model={self.model!r}, scheduler={self.scheduler!r})"

    # -- engine ------------------------------------------------------------------

    def tokenizer(self) -> Any:
        """The model's own tokenizer (loaded without starting the engine)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def _start(self) -> Any:
        with self._start_lock:
            if self._engine is None:
                from vllm import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                os.environ.setdefault("HF_HUB_OFFLINE", "1")

                class _Engine(AsyncLLM):  # type: ignore[misc]
                    def __del__(self) -> None:  # after close(), at interpreter exit
                        with contextlib.suppress(Exception):
                            super().__del__()

                try:
                    self._engine = _Engine.from_engine_args(AsyncEngineArgs(**self.engine_args))
                except TypeError as exc:  # an engine argument vLLM does not know
                    msg = f"invalid vllm_args: {exc}"
                    raise ConfigError(msg) from exc
                atexit.register(self._close_at_exit)
            return self._engine

    def close(self) -> None:
        """Shut the engine down (it restarts on the next request)."""
        with self._start_lock:
            engine, self._engine = self._engine, None
        if engine is None:
            return
        atexit.unregister(self._close_at_exit)
        handler = getattr(engine, "output_handler", None)
        if handler is not None:  # stop reading outputs first, or it reports the engine dead
            engine.output_handler = None
            _aio.loop().call_soon_threadsafe(handler.cancel)
        engine.shutdown()
        _SHUT_DOWN.append(engine)  # collected at exit, after its shutdown

    def _close_at_exit(self) -> None:
        # its handlers' streams may be closed by now (pytest's capture, a notebook's)
        logging.getLogger("vllm").setLevel(logging.CRITICAL)
        self.close()

    def prompt(self, request: Request) -> str:
        """The request's messages through the model's chat template."""
        text: str = self.tokenizer().apply_chat_template(
            request.messages(), tokenize=False, add_generation_prompt=True
        )
        return text

    def framing_tokens(self, system: str | None = None) -> tuple[int, int]:
        """Tokens the chat template adds before and after a user message.

        The estimator adds them to every prompt; the head (default system
        prompt, role markers) is shared by all requests, so it is cacheable.
        """
        marker = "\ufffcSEMFRAME\ufffc"
        text = self.prompt(Request(0, 0, marker, system, 1, 0.0, None, 0))
        head, _, tail = text.partition(marker)
        tok = self.tokenizer()
        return (
            len(tok.encode(head, add_special_tokens=False)),
            len(tok.encode(tail, add_special_tokens=False)),
        )

    def sampling_params(self, request: Request) -> Any:
        """The engine's ``SamplingParams`` for ``request`` (final output only)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None
        if request.schema is not None:
            structured = StructuredOutputsParams(json=dict(request.schema))
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            logprobs=request.logprobs or None,
            structured_outputs=structured,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=rel_tags(request),
        )

    # -- requests ------------------------------------------------------------------

    async def acomplete(self, request: Request) -> Completion:
        """Submit one request to the engine and wait for its answer."""
        engine = self._engine or await asyncio.to_thread(self._start)
        prompt = self.prompt(request)
        params = self.sampling_params(request)
        final = None
        try:
            async for out in engine.generate(prompt, params, f"semframe-{next(self._ids)}"):
                final = out
        except Exception as exc:  # vLLM's errors, mapped to ours
            raise _map_error(exc) from exc
        if final is None or not final.outputs:
            msg = "vllm: the engine returned no output"
            raise TransientError(msg)
        return _completion(request.id, final)

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        """Answer one request and wait for it (the executor awaits :meth:`acomplete`)."""
        return _aio.run(self.acomplete(request))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts under the model's own tokenizer."""
        tok = self.tokenizer()
        return [len(tok.encode(t, add_special_tokens=False)) for t in texts]


def _model_window(path: Any) -> int | None:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = cfg.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def _map_error(exc: Exception) -> Exception:
    kind = type(exc).__name__
    if kind == "EngineDeadError":
        return RunAborted(f"vllm: the engine died: {exc}")
    if kind in {"ValueError", "VLLMValidationError"}:
        return RequestRejected(f"vllm rejected the request: {exc}")
    return TransientError(f"vllm: {kind}: {exc}")


def _completion(request_id: int, out: Any) -> Completion:
    choice = out.outputs[0]
    token_ids = list(choice.token_ids or ())
    usage = Usage(
        prompt_tokens=len(out.prompt_token_ids or ()),
        cached_tokens=int(out.num_cached_tokens or 0),
        output_tokens=len(token_ids),
    )
    logprobs = None
    tokens = None
    if choice.logprobs:
        lps: list[float] = []
        toks: list[TokenLogprob] = []
        for token_id, entry in zip(token_ids, choice.logprobs, strict=False):
            chosen = entry.get(token_id)
            top = tuple(
                (str(lp.decoded_token), float(lp.logprob))
                for _, lp in sorted(entry.items(), key=lambda kv: kv[1].rank or 0)
            )
            value = float(chosen.logprob) if chosen is not None else float("-inf")
            text = str(chosen.decoded_token) if chosen is not None else ""
            lps.append(value)
            toks.append(TokenLogprob(text, value, top))
        logprobs, tokens = tuple(lps), tuple(toks)
    return Completion(request_id, choice.text, usage, choice.finish_reason, logprobs, tokens)


class VllmServerBackend(OpenAIBackend):
    """A vLLM OpenAI-compatible server (``semframe serve``), through the OpenAI SDK."""

    name = "vllm"

    cost: SlotCost  # type: ignore[assignment]

    def __init__(self, model: str, *, base_url: str, **kwargs: Any) -> None:
        super().__init__(model, base_url=base_url, **kwargs)
        limit = self.capabilities.max_concurrency
        self.capabilities = Capabilities(
            prefix_cache="shared",
            json_schema=True,
            logprobs=True,
            max_concurrency=limit,
            context_window=self.capabilities.context_window,  # the server's max_model_len
            relquery_aware=True,
            async_io=True,
        )
        self.cost = SlotCost(model, self.count_tokens, limit, engine="vllm")

    def __repr__(self) -> str:
        return f"VllmServerBackend(model={self.model!r}, base_url={self.endpoint!r})"

    def body(self, request: Request) -> dict[str, Any]:
        """The OpenAI body, with our scheduler's tags in ``vllm_xargs``."""
        body = super().body(request)
        body.pop("prompt_cache_key", None)  # vLLM's cache is keyed by content
        body["extra_body"] = {"vllm_xargs": rel_tags(request)}
        return body

    def batch_submit(self, requests: Sequence[Request]) -> str:
        """Refuse: vLLM servers have no batch API (``capabilities.batch_api`` is off)."""
        msg = "backend 'vllm' has no batch API; run with batch=False"
        raise ConfigError(msg)


def create(model: str | None, settings: Mapping[str, Any]) -> VllmBackend | VllmServerBackend:
    """Factory for ``backend="vllm"`` (the registry keeps one engine per model and options)."""
    base_url = settings["base_url"]
    if base_url:
        if not model:
            msg = (
                "backend 'vllm' with base_url needs model=: the name the server serves "
                "(the --model it was started with)."
            )
            raise ConfigError(msg)
        return VllmServerBackend(
            model,
            base_url=base_url,
            client=settings["client"],
            timeout=settings["timeout"],
            max_concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
            connect_timeout=settings["connect_timeout"],
            window=settings["context_window"],
        )
    return VllmBackend(
        model or DEFAULT_MODEL,
        scheduler=settings["vllm_scheduler"],
        vllm_args=settings["vllm_args"],
        max_concurrency=settings["max_concurrency"] or MAX_CONCURRENCY,
        models_dir=cache_dir(settings["cache_dir"]) / "models",
    )


def calibrate_vllm(
    backend: Any, directory: str | Path, *, rounds: int = 3, seed: int = 0
) -> EngineModel:
    """Measure a vLLM engine once on this machine and store its :class:`EngineModel`.

    Starts a second engine like ``backend``'s (same model and engine arguments)
    with our scheduler tracing every step, sends waves of requests of varied
    prompt lengths and batch sizes, fits the cost models to the steps, and
    stores the result (about a minute or two on a CPU, plus engine start).

    Parameters
    ----------
    backend : VllmBackend
        The in-process vLLM backend to calibrate.
    directory : str or Path
        The cache directory.
    """
    rng = random.Random(seed)
    words = [
        "the",
        "film",
        "a",
        "review",
        "of",
        "plot",
        "actor",
        "scene",
        "story",
        "music",
        "light",
        "city",
        "night",
    ]
    with tempfile.TemporaryDirectory(prefix="semframe-calibrate-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        args = dict(backend.engine_args)
        extra = dict(args.get("additional_config") or {})
        ours = dict(extra.get("semframe") or {})
        ours.update({"policy": "fcfs", "trace": str(trace)})
        extra["semframe"] = ours
        args["additional_config"] = extra
        for key in ("model", "enable_prefix_caching", "scheduler_cls"):
            args.pop(key, None)
        probe = VllmBackend(backend.model, scheduler="fcfs", vllm_args=args, max_concurrency=512)

        def prompt(length: int) -> str:
            return " ".join(rng.choice(words) for _ in range(length))

        async def wave(sizes: Sequence[int], out: int) -> None:
            reqs = [Request(k, k, prompt(s), None, out, 0.0, None, k) for k, s in enumerate(sizes)]
            await asyncio.gather(*(probe.acomplete(r) for r in reqs))

        try:
            _aio.run(wave([16] * 4, 4))  # start and warm the engine
            with trace.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"marker": "measure"}) + "\n")
            for _ in range(rounds):
                for sizes, out in (
                    ([60] * 2, 24),
                    ([120] * 8, 16),
                    ([400] * 4, 8),
                    ([900] * 2, 8),
                    ([rng.randint(20, 600) for _ in range(16)], 12),
                ):
                    _aio.run(wave(sizes, out))
            cache_cfg = probe._engine.vllm_config.cache_config
            sched_cfg = probe._engine.vllm_config.scheduler_config
            block_size = int(cache_cfg.block_size)
            num_blocks = int(cache_cfg.num_gpu_blocks or 0)
            seqs = int(sched_cfg.max_num_seqs)
            batched = int(sched_cfg.max_num_batched_tokens)
        finally:
            probe.close()
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cal = calibrate_from_trace(trace, after="measure", source=f"vllm {backend.model}")
    engine = EngineModel(
        cal, block_size, max(1, num_blocks), seqs, batched, f"{now} {platform.node()}"
    )
    store_engine_model(engine, directory, backend.model)
    return engine
