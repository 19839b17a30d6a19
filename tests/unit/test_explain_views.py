"""The explain view's report model against what older stores hold."""

from __future__ import annotations

from typing import Any

from orchestrator.api.explain_views import ReportView


def report(findings: list[Any]) -> dict[str, Any]:
    return {
        "report_id": "r1",
        "generation": 1,
        "session_id": "s1",
        "summary": "turbid",
        "findings": findings,
        "evidence_refs": [],
        "outcome": "completed",
        "created_at": "2026-12-01T08:00:00+00:00",
    }


def test_a_finding_of_an_older_shape_is_sent_as_text_not_a_failed_view() -> None:
    # Reports saved before findings were typed could hold any JSON value in the list.
    old = {"text": "t", "origin": "guessed"}  # an origin no longer in the vocabulary
    view = ReportView.model_validate(report(["plain", {"text": "cited"}, {"x": 1}, 7, None, old]))
    sent = view.model_dump(mode="json", exclude_unset=True)
    assert sent["findings"] == [
        "plain",
        {"text": "cited"},
        '{"x": 1}',
        "7",
        "null",
        '{"origin": "guessed", "text": "t"}',
    ]


def test_a_typed_finding_keeps_what_it_cites() -> None:
    finding = {"text": "c", "evidence_ids": ["ev-1"], "whole_range": True, "origin": "synthetic"}
    view = ReportView.model_validate(report([finding]))
    assert view.model_dump(mode="json", exclude_unset=True)["findings"] == [finding]
