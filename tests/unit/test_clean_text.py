"""`agent.text.clean`: NUL and lone surrogates anywhere in a value become U+FFFD; a value with
none is returned as it is, without a walk."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.agent import text
from orchestrator.agent.text import REPLACEMENT, clean


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": ["ok", {"b": "x\x00y"}]}, {"a": ["ok", {"b": f"x{REPLACEMENT}y"}]}),
        ({"k\x00": 1}, {f"k{REPLACEMENT}": 1}),
        ([1, 2.5, None, True, "\ud800"], [1, 2.5, None, True, REPLACEMENT]),
        ({"deep": [[[{"v": "a\udfffb"}]]]}, {"deep": [[[{"v": f"a{REPLACEMENT}b"}]]]}),
        (("t", "\x00"), ["t", REPLACEMENT]),
        ({"pair": "😀\x00"}, {"pair": f"😀{REPLACEMENT}"}),
    ],
)
def test_every_string_is_cleaned_keys_included(value: Any, expected: Any) -> None:
    assert clean(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        {"rows": [{"t": "2026-01-01T00:00:00", "v": 1.25}], "note": "浊度 😀"},
        {"nan": float("nan")},
        {},
    ],
)
def test_a_clean_value_comes_back_as_the_same_object(value: Any) -> None:
    cleaned = clean(value)
    assert cleaned is value


def test_the_text_of_an_escape_is_left_as_it_is() -> None:
    value = [{"escaped": "\\u0000 is text here"}]  # a backslash before u0000
    assert clean(value) == [{"escaped": "\\u0000 is text here"}]


def test_a_value_json_cannot_write_is_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    value = {1: {"s": "a\x00"}, "o": object}
    assert clean(value)[1] == {"s": f"a{REPLACEMENT}"}
    walked: list[Any] = []
    walk = text._clean
    monkeypatch.setattr(text, "_clean", lambda v: walked.append(v) or walk(v))
    clean({"plain": ["text"]})
    assert walked == []


@pytest.mark.parametrize(
    "value",
    [{"rows": [{"v": 1.5, "t": "浊度"}]}, {"bad": "a\x00b", "k\ud800": ["x"]}, [], {"n": None}],
)
def test_clean_json_gives_the_cleaned_value_and_its_json_text(value: Any) -> None:
    import json

    cleaned, text_ = text.clean_json(value)
    assert cleaned == clean(value)
    assert text_ == json.dumps(cleaned, ensure_ascii=False)
    text_.encode("utf-8")  # what the store sends


def test_clean_json_of_a_value_json_cannot_write_gives_no_text() -> None:
    cleaned, text_ = text.clean_json({"when": object})
    assert cleaned == {"when": object}
    assert text_ is None
