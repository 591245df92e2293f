from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semframe.core.table import MISSING
from semframe.core.template import Placeholder, in_words, parse_template
from semframe.errors import ColumnError, TemplateError


def test_placeholders_and_escapes() -> None:
    t = parse_template("A {x} and {{literal}} and {y} and {x} again }}")
    assert t.fields == ("x", "y")
    assert t.instruction() == "A [x] and {literal} and [y] and [x] again }"


def test_names_with_spaces_and_punctuation() -> None:
    t = parse_template("Rate {movie title} by {critic's name (full)}: {score%}")
    assert t.fields == ("movie title", "critic's name (full)", "score%")
    assert t.resolve(["movie title", "critic's name (full)", "score%"]) is t


def test_integer_column_names_are_strings() -> None:
    assert parse_template("v={0}").resolve([0, 1]).fields == ("0",)


def test_stripped_name_matches_when_exact_missing() -> None:
    t = parse_template("Is { review } good?").resolve(["review"])
    assert t.fields == ("review",)
    assert t.parts[1] == Placeholder("review")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "template is empty"),
        ("   \n", "template is empty"),
        ("no fields here", "names no column"),
        ("{{only escaped}}", "names no column"),
        ("open {x", "unbalanced '{' at position 5"),
        ("close x}", "unbalanced '}' at position 7"),
        ("nested {a{b}}", "unbalanced '{' at position 7"),
        ("empty {}", "empty placeholder"),
        ("blank { }", "empty placeholder"),
    ],
)
def test_bad_templates(text: str, fragment: str) -> None:
    with pytest.raises(TemplateError, match=fragment):
        parse_template(text)


def test_non_string_template() -> None:
    with pytest.raises(TemplateError, match="must be a str, got int"):
        parse_template(3)


def test_unknown_column_lists_available() -> None:
    with pytest.raises(ColumnError) as info:
        parse_template("Is {reveiw} good?").resolve(["review", "movie_title"])
    message = str(info.value)
    assert "'reveiw'" in message
    assert "Did you mean 'review'?" in message
    assert "Available columns: 'review', 'movie_title'" in message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_parser_never_crashes_unexpectedly(text: str) -> None:
    """Fuzz: any string either parses or raises TemplateError; parses round-trip."""
    try:
        t = parse_template(text, require_fields=False)
    except TemplateError:
        return
    rebuilt = "".join(
        p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else "{" + p.name + "}"
        for p in t.parts
    )
    assert parse_template(rebuilt, require_fields=False).parts == t.parts


def _restated_one(template: str, row: dict[str, str], inline: int) -> str:
    """The rule of Template.restated, row by row: short printable values inline, else named."""
    t = parse_template(template)
    text, before = "", ""
    for part in t.parts:
        if isinstance(part, str):
            text += part
            before += part
            continue
        value = row[part.name]
        if 0 < len(value) <= inline and value.isprintable() and value != MISSING:
            text += value
        else:
            words = in_words(part.name, before)
            text += f"{words} above" if words else "above"
        before = ""
    return text


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(
        st.tuples(
            st.sampled_from(["Alien", "", "<missing>", "x" * 12, "a\nb", "Heat"]),
            st.text(max_size=14),
        ),
        min_size=1,
        max_size=30,
    ),
    inline=st.integers(0, 13),
    data=st.data(),
)
def test_restated_rows_match_the_rule_row_by_row(
    values: list[tuple[str, str]], inline: int, data: st.DataObject
) -> None:
    template = "Is {movie} in {the_genre} like {movie}? {{ok}}"
    t = parse_template(template)
    columns = {"movie": [m for m, _ in values], "the_genre": [g for _, g in values]}
    rows = data.draw(st.lists(st.integers(0, len(values) - 1), max_size=40))
    got = t.restated_rows(columns, rows, inline=inline)
    want = [_restated_one(template, {k: v[r] for k, v in columns.items()}, inline) for r in rows]
    assert got == want
