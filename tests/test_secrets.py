"""API keys never leave the client: not in logs, reprs, exceptions, cache files or progress.

Keys reach semframe two ways, through the environment (``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``) and inside a client the caller built
(``client=openai.AsyncOpenAI(api_key=...)``). Every test here runs real calls
against the provider emulator with both, captures everything semframe could
show (log records of every logger at DEBUG, stdout and stderr at the file
descriptor level with the progress line on, reprs, exception chains,
tracebacks) and searches it, and the bytes of every file semframe wrote, for
the keys and for any 12-character piece of them.
"""

from __future__ import annotations

import functools
import logging
import pickle
import traceback
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pandas as pd
import pytest

import semframe
from semframe.backends import get_backend, reset_backends
from semframe.errors import RunAborted
from semframe.runtime.batch import run_batch
from semframe.runtime.progress import Progress
from semframe.testing.emulator import Latency, ProviderEmulator

ENV_KEY = "sk-envkey-SECRET-0123456789abcdefghij"
CLIENT_KEY = "sk-clientkey-SECRET-9876543210zyxwvu"
KEYS = (ENV_KEY, CLIENT_KEY)


def _pieces(key: str) -> list[str]:
    """The key and every 12-character piece of it past the ``sk-`` prefix."""
    return [key] + [key[i : i + 12] for i in range(3, len(key) - 11)]


def assert_no_secret(text: str | bytes, where: str) -> None:
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    for key in KEYS:
        for piece in _pieces(key):
            assert piece.encode() not in data, f"a piece of an API key ({piece!r}) in {where}"


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEmulator]:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENV_KEY)
    with ProviderEmulator(latency=Latency(0), batch_polls=1) as server:
        yield server


@pytest.fixture
def everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):  # every logger: semframe's, the SDKs', httpx's
        yield caplog


def _frame(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame({"review": [f"review {i}" for i in range(n)], "movie": ["m"] * n})


def _scan_files(folder: Path) -> int:
    scanned = 0
    for path in folder.rglob("*"):
        if path.is_file():
            assert_no_secret(path.read_bytes(), str(path))
            scanned += 1
    return scanned


def test_env_and_client_keys_never_appear_anywhere(
    emu: ProviderEmulator,
    everything_logged: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import semframe.runtime.execute

    # draw the progress line at once (it waits a second by default)
    monkeypatch.setattr(semframe.runtime.execute, "Progress", functools.partial(Progress, delay=0))
    df = _frame()
    shown: list[str] = []
    for backend, url in (("openai", emu.openai_url), ("anthropic", emu.anthropic_url)):
        out = df.llm.map("Summarize {review}", backend=backend, base_url=url, progress="on")
        stats = semframe.last_run()
        est = df.llm.estimate("Summarize {review}", backend=backend, base_url=url)
        shown += [repr(out), repr(stats), repr(est), str(est), est._repr_html_()]
    aclient = openai.AsyncOpenAI(api_key=CLIENT_KEY, base_url=emu.openai_url, max_retries=0)
    claude = anthropic.AsyncAnthropic(api_key=CLIENT_KEY, base_url=emu.anthropic_url)
    for backend, client in (("openai", aclient), ("anthropic", claude)):
        with semframe.using(client=client, backend=backend, progress="on"):
            df.llm.filter("Is {review} good?", cache=False)
            cfg = semframe.config()
            shown += [repr(cfg), str(cfg), repr(semframe.last_run())]
            shown.append(repr(get_backend(backend, model=None, settings=cfg)))
    captured = capfd.readouterr()
    assert "6/6 rows" in captured.err, "the progress line was shown"
    assert_no_secret(captured.out + captured.err, "stdout/stderr")
    assert_no_secret(everything_logged.text, "log records")
    assert any(r.levelno == logging.DEBUG for r in everything_logged.records)
    for text in shown:
        assert_no_secret(text, "a repr")
    assert _scan_files(Path(semframe.config()["cache_dir"])) >= 1  # results.sqlite and its WAL


def test_a_rejected_key_is_not_in_the_error_its_chain_or_its_traceback(
    monkeypatch: pytest.MonkeyPatch, everything_logged: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENV_KEY)
    df = _frame(3)
    with ProviderEmulator(latency=Latency(0), api_keys={"sk-the-only-valid-one-000"}) as server:
        cases = [
            ("openai", server.openai_url, None),
            ("anthropic", server.anthropic_url, None),
            (
                "openai",
                server.openai_url,
                openai.OpenAI(api_key=CLIENT_KEY, base_url=server.openai_url, max_retries=0),
            ),
            (
                "anthropic",
                server.anthropic_url,
                anthropic.Anthropic(api_key=CLIENT_KEY, base_url=server.anthropic_url),
            ),
        ]
        for backend, url, client in cases:
            with pytest.raises(RunAborted, match="401") as info:
                df.llm.map(
                    "Summarize {review}", backend=backend, base_url=url, client=client, cache=False
                )
            exc = info.value
            chain: list[BaseException] = []
            cause: BaseException | None = exc
            while cause is not None and len(chain) < 10:
                chain.append(cause)
                cause = cause.__cause__ or cause.__context__
            for link in chain:
                assert_no_secret(f"{link!s} {link!r} {link.args!r}", "an exception")
            assert_no_secret("".join(traceback.format_exception(exc)), "a traceback")
            assert_no_secret(pickle.dumps(exc.outcomes), "the outcomes of RunAborted")
    assert_no_secret(everything_logged.text, "log records")


def test_batch_state_files_hold_no_key(emu: ProviderEmulator, tmp_path: Path) -> None:
    df = _frame(4)
    plan = df.llm.plan("Summarize {review}", op="map")
    client = openai.OpenAI(api_key=CLIENT_KEY, base_url=emu.openai_url, max_retries=0)
    for settings in (
        semframe.config(backend="openai", base_url=emu.openai_url),
        semframe.config(backend="openai", client=client),
    ):
        backend = get_backend("openai", model=None, settings=settings)

        class Stop(Exception):
            pass

        def stop(_: float) -> None:
            raise Stop

        with pytest.raises(Stop):  # dies while the batch runs: its state file stays
            run_batch(plan, backend, directory=tmp_path, progress="off", sleep=stop)
        states = list((tmp_path / "batches").glob("*.json"))
        assert states, "the state file was written"
        assert _scan_files(tmp_path) == len(states)
        for state in states:
            state.unlink()
    reset_backends("openai")
    client.close()  # the caller's client: semframe leaves closing it to the caller


def test_the_search_would_find_a_key_or_a_piece_of_one() -> None:
    for text in (ENV_KEY, f"Bearer {CLIENT_KEY}", CLIENT_KEY[4:18].encode()):
        with pytest.raises(AssertionError):
            assert_no_secret(text, "a control")
