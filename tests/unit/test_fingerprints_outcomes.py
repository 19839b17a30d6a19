"""Canonical fingerprints and the outcome → status mapping (pure)."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain import outcomes
from orchestrator.domain.fingerprints import (
    NonCanonical,
    canonical_json,
    fingerprint,
    identity_key,
    same_json_value,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


def test_canonical_form_is_sorted_compact_utf8() -> None:
    assert canonical_json({"b": 1, "a": "é", "c": [1, {"y": 2, "x": None}]}) == (
        '{"a":"é","b":1,"c":[1,{"x":null,"y":2}]}'
    )
    expected = hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()
    assert fingerprint({"b": 1, "a": "é"}) == expected


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_key_order_never_changes_the_fingerprint(value: dict[str, object]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert fingerprint(reordered) == fingerprint(value)
    assert len(fingerprint(value)) == 64


def test_json_values_compare_with_one_number_form_and_digests_keep_the_text() -> None:
    # JSON has one number type: 7 and 7.0 (and -0.0 and 0) are the same value when a read-back
    # is compared; a digest keeps the text sent, so stored receipts keep their identity.
    assert same_json_value({"a": [7.0, -0.0, 2.5, True]}, {"a": [7, 0, 2.5, True]})
    assert not same_json_value({"a": 1}, {"a": 1.5})
    assert not same_json_value({"a": True}, {"a": 1})
    assert fingerprint({"a": 1.0}) != fingerprint({"a": 1})


@pytest.mark.parametrize(
    "value", [math.nan, {"a": [1, math.inf]}, {"a": {"b": -math.inf}}, [{"x": float("nan")}]]
)
def test_nan_and_infinity_are_refused(value: object) -> None:
    with pytest.raises(NonCanonical):
        fingerprint(value)


def test_non_json_values_are_refused() -> None:
    with pytest.raises(NonCanonical):
        fingerprint({"a": object()})


def test_identity_keys_have_a_fixed_length_and_separate_their_parts() -> None:
    long = identity_key("intent", "s" * 500, "r", "tool", "d" * 64)
    assert len(long) == len("intent:") + 64
    assert identity_key("call", "ab", "c") != identity_key("call", "a", "bc")
    assert identity_key("call", "s", "c") != identity_key("intent", "s", "c")
    with pytest.raises(ValueError, match="kind"):
        identity_key("a:b", "x")


def test_the_seed_rules_of_the_mapping() -> None:
    expected = {
        "invalid_arguments": "failed",
        "not_sent": "failed",
        "rejected": "failed",
        "command_failed": "failed",
        "transport_broken": "unknown",
        "timed_out": "unknown",
        "unreadable_response": "unknown",
        "server_error": "unknown",
        "raised": "unknown",
        "cancelled": "unknown",
        "recovered": "unknown",
        "record_failed": "unknown",
        "submitted": "pending",
        "succeeded": "succeeded",
        "verified": "succeeded",
    }
    for outcome, status in expected.items():
        assert outcomes.tool_status(outcome) == status, outcome  # type: ignore[arg-type]
    # A failed record leaves the receipt as it was: still running, until a cold start.
    assert outcomes.receipt_status("record_failed") == "running"
    assert outcomes.receipt_status("cancelled") == "unknown"


def test_reads_are_never_unknown() -> None:
    for outcome in outcomes.OUTCOMES:
        assert outcomes.tool_status(outcome, writes=False) != "unknown"


def test_every_outcome_has_a_fixed_text_that_fits_the_receipt() -> None:
    for outcome in outcomes.OUTCOMES:
        assert outcomes.model_message(outcome)
        assert len(outcomes.summary_for(outcome)) <= 200  # the summary column
    assert outcomes.default_outcome("unknown") in outcomes.OUTCOMES
    for status in ("succeeded", "failed", "pending", "unknown"):
        assert outcomes.tool_status(outcomes.default_outcome(status)) == status  # type: ignore[arg-type]


def test_a_canonical_value_is_written_without_a_walk_in_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every call id's arguments and every write's digest are canonical JSON: the encoder's
    own refusal of NaN and infinity does the check, the walk names the path only on failure."""
    from orchestrator.domain import fingerprints

    walked: list[object] = []
    original = fingerprints.refuse_non_finite
    monkeypatch.setattr(
        fingerprints, "refuse_non_finite", lambda v, p="$": walked.append(v) or original(v, p)
    )
    assert canonical_json({"b": [1.5, {"c": None}], "a": "x"}) == '{"a":"x","b":[1.5,{"c":null}]}'
    assert walked == []
    with pytest.raises(NonCanonical, match=r"\$\.a\[1\]: inf has no canonical JSON form"):
        canonical_json({"a": [1, math.inf]})
    with pytest.raises(NonCanonical, match="not JSON serializable"):
        canonical_json({"a": {1, 2}})
    with pytest.raises(NonCanonical, match=r"\$\.a\[0\]: nan"):
        canonical_json({"a": {math.nan}})  # the path first, as before, though a set is refused
