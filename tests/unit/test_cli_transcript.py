"""`orchestrator tasks transcript`'s page: each kind of entry as the transcript writer records."""

from __future__ import annotations

from orchestrator.cli.tasks import render_transcript


def _page(*items: dict[str, object]) -> dict[str, object]:
    total = {"calls": 1, "prompt_tokens": 900, "completion_tokens": 40}
    return {"task_id": "t-1", "items": list(items), "token_usage": {"total": total}}


def test_a_compaction_summary_shows_its_text() -> None:
    # agent/transcript.py's `compacted` records the text as `summary` (no `content`).
    summary = {
        "seq": 7,
        "generation": 1,
        "turn": 3,
        "kind": "summary",
        "usage": {"prompt_tokens": 900, "completion_tokens": 40},
        "body": {
            "summary": "the turbidity at DM-RN-01 rose after the main burst",
            "source": "model",
            "messages_replaced": 6,
            "tokens_before": 2400,
            "tokens_after": 300,
        },
    }
    shown = render_transcript(_page(summary))
    assert "summary: the turbidity at DM-RN-01 rose after the main burst" in shown
