"""Input checks of the prompt layout, the frame edge and row-error reports.

- A template field whose label reads as the examples' ``answer:`` line is
  refused with ``examples=`` (and allowed without them).
- Malformed ``examples=`` fail with an :class:`InputError`, not a crash.
- The duplicate-column check is linear in the number of columns.
- :class:`RowErrors` says when every row failed instead of claiming that the
  other rows succeeded.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest

from semframe.backends.fake import FakeBackend
from semframe.core.frames import Frame
from semframe.core.parse import BOOL
from semframe.core.plan import RelQuery, validate
from semframe.core.table import Table
from semframe.core.template import parse_template
from semframe.errors import ColumnError, InputError, RequestRejected, RowError, RowErrors

QA = pd.DataFrame({"question": ["2+2?", "3+3?"], "answer": ["4", "7"]})


# --- 1. a field labeled like the examples' answer line ---------------------------------


@pytest.mark.parametrize("op", ["map", "filter", "classify"])
def test_answer_column_with_examples_is_refused_before_sending(fake: FakeBackend, op: str) -> None:
    extra = {"labels": ["right", "wrong"]} if op == "classify" else {}
    run = getattr(QA.llm, op)
    with pytest.raises(InputError) as info:
        run(
            "Is {answer} right for {question}?",
            backend="fake",
            examples=[{"question": "1+1?", "answer": "2"}],
            **extra,
        )
    message = str(info.value)
    assert "'answer'" in message
    assert "answer:" in message
    assert "df.rename(columns=" in message
    assert fake.history == []


@pytest.mark.parametrize(
    "column",
    [
        "Answer",
        "ANSWER",
        " answer ",
        "answer :",
        "answer: final",
        "\uff41\uff4e\uff53\uff57\uff45\uff52",  # fullwidth 'answer'
        "answer\u200b",  # with a zero-width space
    ],
)
def test_labels_that_read_as_the_answer_line_are_refused(fake: FakeBackend, column: str) -> None:
    df = pd.DataFrame({"question": ["2+2?"], column: ["4"]})
    template = "Is {" + column + "} right for {question}?"
    with pytest.raises(InputError) as info:
        df.llm.filter(template, backend="fake", examples=[{"question": "1+1?", column: "2"}])
    assert repr(column) in str(info.value)
    assert "rename" in str(info.value)
    assert fake.history == []


def test_answer_check_covers_plan_and_estimate(fake: FakeBackend) -> None:
    examples = [{"question": "1+1?", "answer": "2"}]
    with pytest.raises(InputError, match="'answer'"):
        QA.llm.plan("Is {answer} right for {question}?", op="filter", examples=examples)
    with pytest.raises(InputError, match="'answer'"):
        QA.llm.filter(
            "Is {answer} right for {question}?", backend="fake", examples=examples, estimate=True
        )
    assert fake.history == []


def test_answer_check_in_validate() -> None:
    rq = RelQuery(
        "filter",
        parse_template("Is {answer} right?"),
        Table.from_columns({"answer": ["4"]}),
        BOOL,
        examples=({"answer": "yes"},),
    )
    with pytest.raises(InputError, match=r"field 'answer'.*df\.rename\(columns="):
        validate(rq)


def test_renamed_column_with_examples_works(fake: FakeBackend) -> None:
    df = QA.rename(columns={"answer": "proposed"})
    out = df.llm.filter(
        "Is {proposed} right for {question}?",
        backend="fake",
        examples=[{"question": "1+1?", "proposed": "2", "answer": "yes"}],
        reorder="none",
    )
    assert len(fake.history) == 2
    assert "Example:\nproposed: 2\nquestion: 1+1?\nanswer: yes" in fake.history[0].prompt
    assert isinstance(out, pd.DataFrame)


@pytest.mark.parametrize("column", ["answers", "answer_text", "the answer", "answered by"])
def test_names_merely_containing_answer_are_allowed(fake: FakeBackend, column: str) -> None:
    df = pd.DataFrame({"question": ["2+2?"], column: ["4"]})
    df.llm.filter(
        "Is {" + column + "} right for {question}?",
        backend="fake",
        examples=[{"question": "1+1?", column: "2", "answer": "yes"}],
    )
    assert f"\n{column}: 4\n" in fake.history[0].prompt


def test_answer_column_without_examples_is_allowed(fake: FakeBackend) -> None:
    """Without examples the only ``answer:`` line is the field itself (documented decision)."""
    out = QA.llm.filter("Is {answer} right for {question}?", backend="fake", reorder="none")
    assert len(fake.history) == 2
    body = fake.history[0].prompt.rsplit("\n\n", 1)[-1]
    assert body == "answer: 4\nquestion: 2+2?\n"
    assert fake.history[0].prompt.count("\nanswer: ") == 1
    assert isinstance(out, pd.DataFrame)
    mapped = QA.llm.map("Explain {answer}", backend="fake")
    assert mapped["llm_output"].tolist() == ["fake: 4", "fake: 7"]


def test_join_qualifies_answer_columns(fake: FakeBackend) -> None:
    """Join fields are labeled ``left.col`` / ``right.col``: never the answer line."""
    left = pd.DataFrame({"answer": ["4"]})
    right = pd.DataFrame({"question": ["2+2?"]})
    left.llm.join(
        right,
        "Does {answer} answer {question}?",
        backend="fake",
        examples=[{"left.answer": "2", "right.question": "1+1?", "answer": "yes"}],
    )
    assert "\nleft.answer: 4\n" in fake.history[0].prompt


# --- malformed examples -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("examples", "fragments"),
    [
        ({"review": "awful", "answer": "no"}, ["got dict", "wrap the one example in a list"]),
        (5, ["examples must be a list of mappings", "['review', 'answer']", "got int (5)"]),
        ("awful", ["examples must be a list", "got str ('awful')"]),
        (["review answer"], ["'review answer'", "is a str", "mapping"]),
        ([{"review": "awful", "answer": "no"}, 3], ["example 2", "is an int", "mapping"]),
    ],
)
def test_examples_that_are_not_mappings_fail_clearly(
    fake: FakeBackend, examples: object, fragments: list[str]
) -> None:
    df = pd.DataFrame({"review": ["great"]})
    with pytest.raises(InputError) as info:
        df.llm.filter("Is {review} positive?", backend="fake", examples=examples)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert fake.history == []


def test_example_lacking_fields_and_answer_names_both(fake: FakeBackend) -> None:
    df = pd.DataFrame({"review": ["great"]})
    with pytest.raises(InputError) as info:
        df.llm.filter("Is {review} positive?", backend="fake", examples=[{"reviw": "bad"}])
    assert "lacks ['review', 'answer']" in str(info.value)
    assert "each example needs the keys ['review', 'answer']" in str(info.value)


# --- 2. duplicate column names, in linear time --------------------------------------------


def test_duplicate_columns_of_a_wide_frame_fail_fast(fake: FakeBackend) -> None:
    names = [f"c{i}" for i in range(50_000)]
    names[-1] = "c7"
    df = pd.DataFrame([range(len(names))], columns=names)
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"duplicate column names \['c7'\]; rename them first\."):
        df.llm.map("{c1}", backend="fake")
    assert time.perf_counter() - start < 5.0
    assert fake.history == []


def test_duplicate_columns_listed_sorted_once() -> None:
    df = pd.DataFrame([[1, 2, 3, 4, 5, 6]], columns=["b", "a", "b", 1, "1", "a"])
    with pytest.raises(InputError) as info:
        _ = Frame.of(df).columns
    assert (
        str(info.value)
        == "the frame has duplicate column names ['1', 'a', 'b']; rename them first."
    )


def test_distinct_wide_frame_is_accepted() -> None:
    names = [f"c{i}" for i in range(50_000)]
    start = time.perf_counter()
    assert len(Frame.of(pd.DataFrame([range(len(names))], columns=names)).columns) == 50_000
    assert time.perf_counter() - start < 5.0


# --- 3. RowErrors when every row failed -------------------------------------------------


def test_map_where_every_row_failed_says_so(fake: FakeBackend) -> None:
    fake.enqueue(RequestRejected("refused"), RequestRejected("refused"))
    with pytest.raises(RowErrors) as info:
        QA.llm.map("Explain {answer}", backend="fake", cache=False)
    message = str(info.value)
    assert message.startswith("all 2 rows failed; nothing succeeded")
    assert "the other rows succeeded" not in message
    assert "`.result`" in message and "errors='keep'" in message
    assert info.value.result["llm_output"].isna().all()
    assert len(info.value.errors) == 2


def test_map_where_some_rows_failed_keeps_the_message(fake: FakeBackend) -> None:
    fake.enqueue(RequestRejected("refused"))
    with pytest.raises(RowErrors) as info:
        QA.llm.map("Explain {answer}", backend="fake", reorder="none", cache=False)
    message = str(info.value)
    assert message.startswith(
        "1 row failed; the other rows succeeded and are in `.result` of this exception "
        "(or pass errors='keep' to get them with an error column)."
    )
    assert info.value.result["llm_output"].tolist() == [None, "fake: 7"]


def test_extract_where_every_row_failed_says_so(fake: FakeBackend) -> None:
    fake.responder = lambda request: "not json"
    with pytest.raises(RowErrors) as info:
        QA.llm.extract("Read {answer}", schema={"n": int}, backend="fake", cache=False)
    assert str(info.value).startswith("all 2 rows failed; nothing succeeded")


def _errors(n: int) -> list[RowError]:
    return [RowError(i, f"r{i}", "parse", "bad", 2) for i in range(n)]


def test_row_errors_messages_directly() -> None:
    some = RowErrors(_errors(2), None, total=3)
    assert str(some).startswith("2 rows failed; the other rows succeeded and are in `.result`")
    assert "row 1 (label 'r1'): parse error after 2 attempts: bad" in str(some)
    every = RowErrors(_errors(3), None, total=3)
    assert str(every).startswith("all 3 rows failed; nothing succeeded")
    assert "the other rows succeeded" not in str(every)
    assert "errors='keep'" in str(every) and "`.result`" in str(every)
    only = RowErrors(_errors(1), None, total=1)
    assert str(only).startswith("the only row failed; nothing succeeded")
    many = RowErrors(_errors(7), None, total=7)
    assert "... and 2 more" in str(many)
    assert every.errors == tuple(_errors(3)) and every.total == 3


def test_row_errors_without_a_total_keep_the_old_message() -> None:
    unknown = RowErrors(_errors(2), None)
    assert unknown.total is None
    assert str(unknown).startswith("2 rows failed; the other rows succeeded")


def test_unknown_column_of_a_wide_frame_lists_some_columns(fake: FakeBackend) -> None:
    names = [f"col_{i}" for i in range(100_000)]
    df = pd.DataFrame([range(len(names))], columns=names)
    with pytest.raises(ColumnError) as info:
        df.llm.map("{colum_77}", backend="fake")
    message = str(info.value)
    assert "Did you mean 'col_77'?" in message
    assert "Available columns (the first 50 of 100,000): 'col_0', 'col_1'," in message
    assert "'col_49', ...." in message and "'col_50'" not in message
    assert len(message) < 2_000
    assert fake.history == []
