"""Invalid answers never become values: empty, cut at max_tokens, NaN, clashing columns.

Every bad answer is asked again (``parse_retries``, once by default), then
reported on its row (``RowErrors``, or the error column with
``errors="keep"``), and nothing invalid is stored in the result cache: a
re-run sends the request again. ``truncated="keep"`` is the one opt-in: a cut
answer that still parses is kept and marked True in a ``*_truncated`` column,
on every run (it is never served from the cache unmarked).

The fake backend scripts answers and finish reasons; the provider emulator
covers the OpenAI and Anthropic wire formats (``finish_reason: "length"``,
``stop_reason: "max_tokens"``) and their batch APIs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pandas as pd
import pytest

import semframe
from semframe.backends import register_backend
from semframe.backends.fake import FakeBackend
from semframe.core.wire import Completion, Request
from semframe.errors import ConfigError, InputError, RowErrors
from semframe.testing.emulator import Fault, Latency, ProviderEmulator

KEY = "sk-test-invalid-answers-0123456789"
DF = pd.DataFrame({"t": ["alpha", "beta", "gamma"]}, index=["a", "b", "c"])


def _when(word: str) -> Callable[[Request], bool]:
    return lambda request: word in request.prompt


class CuttingFake(FakeBackend):
    """The fake backend, except that chosen requests report a cut answer.

    ``cut(request)`` picks them; their finish reason is ``reason`` (OpenAI,
    llama.cpp and vLLM say ``"length"``, Anthropic ``"max_tokens"``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.cut: Callable[[Request], bool] = lambda request: False
        self.reason = "length"

    def complete(self, request: Request, *, slot: int | None = None) -> Completion:
        answer = super().complete(request, slot=slot)
        if self.cut(request):
            return answer._replace(finish_reason=self.reason)
        return answer


@pytest.fixture
def cutting() -> Iterator[CuttingFake]:
    """A fresh :class:`CuttingFake` registered as backend='fake' for this test."""
    backend = CuttingFake()
    register_backend("fake", lambda model, settings: backend)
    yield backend
    register_backend("fake", "semframe.backends.fake:create")


def _stats() -> semframe.RunStats:
    stats = semframe.last_run()
    assert stats is not None
    return stats


# -- empty answers ---------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["", "  \n\t "])
def test_map_empty_answer_is_retried_then_a_row_error(fake: FakeBackend, empty: str) -> None:
    fake.responder = lambda request: empty if "beta" in request.prompt else "fine"
    with pytest.raises(RowErrors) as info:
        DF.llm.map("Describe {t}", backend="fake")
    [error] = info.value.errors
    assert (error.label, error.kind, error.attempts) == ("b", "parse", 2)
    assert "empty answer" in error.message
    result = info.value.result
    assert result["llm_output"].tolist() == ["fine", None, "fine"]


def test_map_empty_answer_is_in_the_error_column_and_never_cached(fake: FakeBackend) -> None:
    fake.responder = lambda request: "" if "beta" in request.prompt else "fine"
    out = DF.llm.map("Describe {t}", out="d", backend="fake", errors="keep")
    assert out["d"].tolist() == ["fine", None, "fine"]
    errors = out["d_error"].tolist()
    assert errors[0] is None and errors[2] is None
    assert errors[1].startswith("parse: empty answer") and "(after 2 attempts)" in errors[1]
    sent = len(fake.history)
    assert sent == 4  # three rows, the empty one twice
    again = DF.llm.map("Describe {t}", out="d", backend="fake", errors="keep")
    assert len(fake.history) == sent + 2, "only the empty row is asked again"
    assert _stats().cache_hits == 2
    pd.testing.assert_frame_equal(again, out)


def test_map_empty_answer_then_a_good_one(fake: FakeBackend) -> None:
    fake.enqueue("")
    out = pd.DataFrame({"t": ["alpha"]}).llm.map("Describe {t}", backend="fake")
    assert out["llm_output"].tolist() == ["fake: alpha"]
    assert len(fake.history) == 2 and _stats().retries == 1


def test_classify_multi_empty_answer_is_an_error_not_an_empty_list(fake: FakeBackend) -> None:
    fake.responder = lambda request: "" if "beta" in request.prompt else '{"answer": ["x"]}'
    out = DF.llm.classify(
        "Tags of {t}", ["x", "y"], out="tags", multi=True, backend="fake", errors="keep"
    )
    assert out["tags"].tolist() == [["x"], None, ["x"]]
    assert "empty answer" in out["tags_error"].tolist()[1]
    sent = len(fake.history)
    DF.llm.classify(
        "Tags of {t}", ["x", "y"], out="tags", multi=True, backend="fake", errors="keep"
    )
    assert len(fake.history) == sent + 2, "the empty answer was not cached"


@pytest.mark.parametrize("answer", ['{"answer": ""}', " , ,", "   "])
def test_classify_multi_text_naming_no_label_is_an_error(fake: FakeBackend, answer: str) -> None:
    fake.responder = lambda request: answer
    with pytest.raises(RowErrors) as info:
        pd.DataFrame({"t": ["alpha"]}).llm.classify(
            "Tags of {t}", ["x", "y"], multi=True, backend="fake"
        )
    assert info.value.errors[0].kind == "parse"


def test_classify_multi_explicit_empty_list_means_no_label_applies(fake: FakeBackend) -> None:
    fake.responder = lambda request: '{"answer": []}' if "beta" in request.prompt else "y, x"
    out = DF.llm.classify("Tags of {t}", ["x", "y"], out="tags", multi=True, backend="fake")
    assert out["tags"].tolist() == [["x", "y"], [], ["x", "y"]]


@pytest.mark.parametrize("op", ["filter", "extract", "classify"])
def test_other_operators_report_an_empty_answer_as_empty(fake: FakeBackend, op: str) -> None:
    fake.responder = lambda request: "\n"
    frame = pd.DataFrame({"t": ["alpha"]})
    run: dict[str, Callable[[], object]] = {
        "filter": lambda: frame.llm.filter("Is {t} good?", backend="fake"),
        "extract": lambda: frame.llm.extract("Read {t}", {"n": int}, backend="fake"),
        "classify": lambda: frame.llm.classify("Kind of {t}", ["x", "y"], backend="fake"),
    }
    with pytest.raises(RowErrors) as info:
        run[op]()
    assert info.value.errors[0].message.startswith("empty answer")


# -- answers cut at max_tokens ------------------------------------------------------------


@pytest.mark.parametrize("reason", ["length", "max_tokens"])
def test_cut_answer_is_retried_then_a_row_error(cutting: CuttingFake, reason: str) -> None:
    cutting.cut, cutting.reason = _when("beta"), reason
    with pytest.raises(RowErrors) as info:
        DF.llm.map("Describe {t}", backend="fake", max_tokens=32)
    [error] = info.value.errors
    assert (error.label, error.kind, error.attempts) == ("b", "parse", 2)
    assert f"cut at max_tokens=32 (finish reason {reason!r})" in error.message
    assert "raise max_tokens" in error.message and "truncated='keep'" in error.message
    assert info.value.result["llm_output"].tolist() == ["fake: alpha", None, "fake: gamma"]
    assert "llm_output_truncated" not in info.value.result.columns


def test_cut_answer_is_never_cached(cutting: CuttingFake) -> None:
    cutting.cut = _when("beta")
    out = DF.llm.map("Describe {t}", backend="fake", errors="keep")
    assert out["llm_output"].isna().tolist() == [False, True, False]
    sent = len(cutting.history)
    cutting.cut = lambda request: False  # the model now finishes
    again = DF.llm.map("Describe {t}", backend="fake")
    assert len(cutting.history) == sent + 1, "the cut row was asked again"
    assert again["llm_output"].tolist() == ["fake: alpha", "fake: beta", "fake: gamma"]


def test_truncated_keep_marks_the_cut_rows_on_every_run(cutting: CuttingFake) -> None:
    cutting.cut = _when("beta")
    out = DF.llm.map("Describe {t}", out="d", backend="fake", truncated="keep")
    assert list(out.columns) == ["t", "d", "d_truncated"]
    assert out["d"].tolist() == ["fake: alpha", "fake: beta", "fake: gamma"]
    assert out["d_truncated"].tolist() == [False, True, False]
    assert str(out["d_truncated"].dtype) == "boolean"
    assert len(cutting.history) == 3, "a cut answer that parses is kept at once"
    # A re-run: the two complete answers come from the result cache; the cut one was
    # never stored, so it is asked again and marked again.
    again = DF.llm.map("Describe {t}", out="d", backend="fake", truncated="keep")
    assert len(cutting.history) == 4
    assert _stats().cache_hits == 2
    pd.testing.assert_frame_equal(again, out)
    # The default run after it does not take the kept cut answer from anywhere.
    with pytest.raises(RowErrors):
        DF.llm.map("Describe {t}", out="d", backend="fake")


def test_truncated_keep_with_errors_keep_has_both_columns(cutting: CuttingFake) -> None:
    cutting.cut = _when("beta")
    cutting.responder = lambda request: "" if "gamma" in request.prompt else "ok"
    out = DF.llm.map("Describe {t}", backend="fake", truncated="keep", errors="keep")
    assert out["llm_output"].tolist() == ["ok", "ok", None]
    assert out["llm_output_truncated"].tolist() == [False, True, False]
    errors = out["llm_output_error"].tolist()
    assert errors[:2] == [None, None] and "empty answer" in errors[2]


def test_truncated_keep_on_filter_extract_and_classify(cutting: CuttingFake) -> None:
    cutting.cut = _when("beta")
    answers = {
        "yes/no": '{"answer": "yes"}',
        "record": '{"n": 7}',
        "label": '{"answer": "x"}',
    }

    def respond(request: Request) -> str:
        schema = request.schema or {}
        props = schema.get("properties", {})
        if "n" in props:
            return answers["record"]
        if set(props.get("answer", {}).get("enum", ())) == {"yes", "no"}:
            return answers["yes/no"]
        return answers["label"]

    cutting.responder = respond
    kept = DF.llm.filter("Is {t} good?", backend="fake", truncated="keep")
    assert kept["llm_truncated"].tolist() == [False, True, False]
    extracted = DF.llm.extract("Read {t}", {"n": int}, backend="fake", truncated="keep")
    assert extracted["n"].tolist() == [7, 7, 7]
    assert extracted["llm_truncated"].tolist() == [False, True, False]
    labelled = DF.llm.classify("Kind of {t}", ["x", "y"], backend="fake", truncated="keep")
    assert labelled["label_truncated"].tolist() == [False, True, False]
    # Without the opt-in there is no marker column, and the cut rows fail.
    with pytest.raises(RowErrors) as info:
        DF.llm.classify("Kind of {t}", ["x", "y"], backend="fake")
    assert [e.label for e in info.value.errors] == ["b"]
    assert "label_truncated" not in info.value.result.columns


def test_agg_cut_answer_fails_its_group_or_is_kept_and_marked(cutting: CuttingFake) -> None:
    frame = pd.DataFrame({"g": ["p", "p", "q"], "t": ["alpha", "beta", "gamma"]})
    cutting.cut = _when("gamma")
    with pytest.raises(RowErrors) as info:
        frame.llm.agg("Sum up {t}", by="g", backend="fake")
    [error] = info.value.errors
    assert error.label == "q" and "cut at max_tokens" in error.message
    assert "truncated='keep'" in error.message
    kept = frame.llm.agg("Sum up {t}", by="g", out="s", backend="fake", truncated="keep")
    assert kept["s"].notna().all()
    assert kept["s_truncated"].tolist() == [False, True]
    # a cut partial answer marks its group too: one row per chunk, then combined
    cutting.cut = _when("alpha")
    parts = frame.llm.agg(
        "Sum up {t}", by="g", out="s", backend="fake", truncated="keep", chunk_tokens=12
    )
    assert (semframe.last_op() or pytest.fail("no op stats")).counts["levels"] == 2
    assert parts["s_truncated"].tolist() == [True, False]
    with pytest.raises(InputError, match="'s_truncated', which the frame already has"):
        frame.assign(s_truncated=0).llm.agg("Sum up {t}", out="s", backend="fake", truncated="keep")


def test_truncated_keep_does_not_keep_a_cut_answer_that_does_not_parse(
    cutting: CuttingFake,
) -> None:
    cutting.cut = _when("beta")
    cutting.responder = lambda request: '{"n": 1' if "beta" in request.prompt else '{"n": 2}'
    with pytest.raises(RowErrors) as info:
        DF.llm.extract("Read {t}", {"n": int}, backend="fake", truncated="keep", max_tokens=8)
    [error] = info.value.errors
    assert error.attempts == 2
    assert "cut at max_tokens=8" in error.message and "does not parse" in error.message


def test_truncated_keep_refuses_to_overwrite_a_marker_column(fake: FakeBackend) -> None:
    frame = DF.assign(llm_output_truncated=1, llm_truncated=2)
    with pytest.raises(InputError, match="'llm_output_truncated', which the frame already has"):
        frame.llm.map("Describe {t}", backend="fake", truncated="keep")
    with pytest.raises(InputError, match="'llm_truncated', which the frame already has"):
        frame.llm.filter("Is {t} good?", backend="fake", truncated="keep")
    with pytest.raises(InputError, match="'llm_truncated', which this call also adds"):
        DF.llm.extract("Read {t}", {"llm_truncated": str}, backend="fake", truncated="keep")
    assert fake.history == []
    # Without the opt-in nothing is added, so nothing clashes.
    assert len(frame.llm.map("Describe {t}", backend="fake")) == 3


def test_truncated_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match="valid: 'error', 'keep'"):
        semframe.config(truncated="maybe")
    assert semframe.config()["truncated"] == "error"


# -- extract: NaN is not a number the caller asked for -----------------------------------


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("nullable", [False, True])
def test_extract_non_finite_float_is_a_row_error(
    fake: FakeBackend, bad: str, nullable: bool
) -> None:
    fake.responder = lambda request: (
        f'{{"score": {bad}}}' if "beta" in request.prompt else '{"score": 0.5}'
    )
    schema = {"score": float | None} if nullable else {"score": float}
    out = DF.llm.extract("Score {t}", schema, backend="fake", errors="keep")
    assert out["score"].tolist()[::2] == [0.5, 0.5]
    assert pd.isna(out["score"].tolist()[1])
    error = out["llm_error"].tolist()[1]
    assert error.startswith("parse: field 'score' is") and "finite number" in error
    sent = len(fake.history)
    assert sent == 4
    DF.llm.extract("Score {t}", schema, backend="fake", errors="keep")
    assert len(fake.history) == sent + 2, "the NaN answer was not cached"


def test_extract_nullable_float_still_takes_null(fake: FakeBackend) -> None:
    fake.responder = lambda request: '{"score": null}'
    out = DF.llm.extract("Score {t}", {"score": float | None}, backend="fake")
    assert out["score"].isna().all()
    assert len(fake.history) == 3


# -- filter(errors="keep") and the caller's own llm_error column ----------------------


def test_filter_errors_keep_refuses_to_overwrite_llm_error(fake: FakeBackend) -> None:
    frame = DF.assign(llm_error=["mine"] * 3)
    with pytest.raises(InputError, match="errors='keep' adds the column 'llm_error'"):
        frame.llm.filter("Is {t} good?", backend="fake", errors="keep")
    assert fake.history == []


def test_filter_errors_raise_keeps_the_callers_llm_error_column(fake: FakeBackend) -> None:
    fake.responder = lambda request: "perhaps" if "beta" in request.prompt else "yes"
    frame = DF.assign(llm_error=["mine"] * 3)
    with pytest.raises(RowErrors) as info:
        frame.llm.filter("Is {t} good?", backend="fake")
    assert [e.label for e in info.value.errors] == ["b"]
    assert info.value.result["llm_error"].tolist() == ["mine"] * 3


# -- the wire formats: the provider emulator ---------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderEmulator]:
    with ProviderEmulator(latency=Latency(0)) as emu:
        yield emu


@pytest.fixture
def emu(server: ProviderEmulator, monkeypatch: pytest.MonkeyPatch) -> ProviderEmulator:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    server.reset()
    return server


def _url(emu: ProviderEmulator, backend: str) -> str:
    return emu.openai_url if backend == "openai" else emu.anthropic_url


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_api_empty_answer_is_a_row_error_and_not_cached(
    emu: ProviderEmulator, backend: str
) -> None:
    emu.faults.inject(Fault.empty(), when=lambda prompt: "beta" in prompt)
    settings = {"backend": backend, "base_url": _url(emu, backend), "errors": "keep"}
    out = DF.llm.map("Describe {t}", **settings)
    assert out["llm_output"].isna().tolist() == [False, True, False]
    assert "empty answer" in out["llm_output_error"].tolist()[1]
    billed = len(emu.ledger)
    assert billed == 4
    DF.llm.map("Describe {t}", **settings)
    assert len(emu.ledger) == billed + 2, "only the empty row was asked again"


@pytest.mark.parametrize(
    ("backend", "reason"), [("openai", "'length'"), ("anthropic", "'max_tokens'")]
)
def test_api_cut_answer_is_a_row_error_and_not_cached(
    emu: ProviderEmulator, backend: str, reason: str
) -> None:
    settings = {"backend": backend, "base_url": _url(emu, backend), "max_tokens": 3}
    with pytest.raises(RowErrors) as info:
        DF.llm.map("Describe {t}", **settings)
    assert len(info.value.errors) == 3
    assert all(
        f"cut at max_tokens=3 (finish reason {reason})" in e.message for e in info.value.errors
    )
    billed = len(emu.ledger)
    assert billed == 6  # every row twice: the retry is cut too
    with pytest.raises(RowErrors):
        DF.llm.map("Describe {t}", **settings)
    assert len(emu.ledger) == billed + 6, "nothing cut was stored in the result cache"


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_api_cut_answer_kept_and_marked_on_request(emu: ProviderEmulator, backend: str) -> None:
    settings = {
        "backend": backend,
        "base_url": _url(emu, backend),
        "max_tokens": 3,
        "truncated": "keep",
    }
    out = DF.llm.map("Describe {t}", **settings)
    assert out["llm_output"].map(lambda s: isinstance(s, str) and s != "").all()
    assert out["llm_output_truncated"].tolist() == [True, True, True]
    assert len(emu.ledger) == 3
    again = DF.llm.map("Describe {t}", **settings)
    assert len(emu.ledger) == 6, "kept cut answers are asked again, never served unmarked"
    pd.testing.assert_frame_equal(again, out)
    whole = DF.llm.map("Describe {t}", backend=backend, base_url=_url(emu, backend))
    assert "llm_output_truncated" not in whole.columns
    assert whole["llm_output"].str.len().gt(out["llm_output"].str.len()).all()


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
def test_batch_mode_applies_the_same_rule(emu: ProviderEmulator, backend: str) -> None:
    settings = {
        "backend": backend,
        "base_url": _url(emu, backend),
        "max_tokens": 3,
        "batch": True,
        "batch_poll_seconds": 0.01,
    }
    with pytest.raises(RowErrors) as info:
        DF.llm.map("Describe {t}", **settings)
    assert len(info.value.errors) == 3
    assert all("cut at max_tokens=3" in e.message for e in info.value.errors)
    assert all(e.attempts == 2 for e in info.value.errors)
    billed = len(emu.ledger)
    assert billed == 6
    kept = DF.llm.map("Describe {t}", truncated="keep", **settings)
    assert kept["llm_output_truncated"].tolist() == [True, True, True]
    assert len(emu.ledger) == billed + 3, "nothing cut had been stored in the result cache"
    assert _stats().batch
