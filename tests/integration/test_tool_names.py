"""Tool names as gpt-oss servers leak them, through the real `openai` client and loopback server.

vLLM and Ollama have sent gpt-oss's calls named `save_report<|channel|>commentary`, with the
harmony namespace (`functions.save_report`) or with `json` glued on (`save_reportjson`). The
host refused them `unknown_tool`, the history showed the model its own leaked name, and a round
could end without its report. A name is now put back to the offered tool by an exact rule
(`orchestrator.agent.tool_names`) and the transcript keeps what the model sent beside what ran;
any other unknown name is refused with the closest real names.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.tool_names import resolved
from orchestrator.services.tasks import Trigger
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import ToolContext
from tests.executions_support import CITED, query_call, report_call
from tests.integration.receipt_rows import chat_session
from tests.integration.test_call_ids import Recorder, WriteNote
from tests.integration.test_openai_model import model_for
from tests.openai_server import OpenAIServer, call
from tests.transcript_support import openai_runtime


@pytest.fixture
def ledger(db: Database) -> ReceiptLedger:
    return ReceiptLedger(db)


OFFERED = {"save_report", "write_note", "query_data_source", "read_tool_result"}


@pytest.mark.parametrize(
    ("sent", "ran"),
    [
        ("save_report", "save_report"),
        ("functions.save_report", "save_report"),
        ("save_report<|channel|>commentary", "save_report"),
        ("functions.save_report<|constrain|>json", "save_report"),
        ("save_reportjson", "save_report"),
        ("save_report json", "save_report"),
        ("functions.save_reportjson<|message|>", "save_report"),
        # Not one tool by the rule: never guessed.
        ("save_reports", None),
        ("report", None),
        ("tools.save_report", None),
        ("<|channel|>commentary", None),
        ("jsonsave_report", None),
        ("", None),
    ],
)
def test_a_name_resolves_only_by_the_exact_rule(sent: str, ran: str | None) -> None:
    assert resolved(sent, OFFERED) == ran


def test_leaked_names_run_the_tool_they_name_and_others_list_the_closest(
    server: OpenAIServer, ledger: ReceiptLedger
) -> None:
    """A write (real receipts) under each leaked form runs once per call, the history sent
    back names the real tool, and a name no rule resolves is refused with the closest."""
    leaked = [
        "functions.write_note",
        "write_note<|channel|>commentary",
        "write_notejson",
        "functions.write_note<|constrain|>json",
    ]
    server.reply(
        tool_calls=[
            *(call(f"c{n}", name, {"text": f"note {n}"}) for n, name in enumerate(leaked)),
            call("c9", "write_notes", {"text": "note 9"}),
        ]
    )
    server.reply(content="noted")
    tool, recorder = WriteNote(), Recorder()
    ctx = ToolContext(owner="alice", session_id=chat_session(ledger.db), round_id="r1")
    end = run_round(
        model_for(server),
        ToolHost([tool], ledger=ledger),
        ctx,
        brief="note what you see",
        max_turns=3,
        stop=threading.Event(),
        recorder=recorder,
    )
    assert end.why == "final_answer"
    assert sorted(tool.ran) == [f"note {n}" for n in range(4)]
    assert [r.status for r in recorder.results] == ["succeeded"] * 4 + ["failed"]
    assert [c.name for c in recorder.calls] == ["write_note"] * 4 + ["write_notes"]
    assert [c.sent_name for c in recorder.calls] == [*leaked, None]
    refused = recorder.results[-1]
    assert refused.code == "unknown_tool"
    assert "the closest tool names: 'write_note'" in (refused.message or "")
    # The history the server read back names the tool that ran, not the leaked form.
    sent_back = [
        c["function"]["name"]
        for m in server.bodies[1]["messages"]
        for c in m.get("tool_calls") or ()
    ]
    assert sent_back == ["write_note"] * 4 + ["write_notes"]


def test_a_gpt_oss_report_under_a_leaked_name_is_saved(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        q = query_call()
        server.reply(tool_calls=[call(q["id"], f"functions.{q['name']}", q["arguments"])])
        report = report_call("c2", "completed", cite=[CITED])
        leaked = "save_report<|channel|>commentary"
        server.reply(tool_calls=[call(report["id"], leaked, report["arguments"])])
        server.reply(content="done")
        task = rt.tasks.trigger(Trigger(task_type="water", title="Turbid")).task
        assert rt.executions.run(task.task_id, 1, worker="w1").ran
        entries = rt.tasks.transcript(task.task_id)["items"]
    finally:
        rt.close()
    calls = [c for e in entries if e["kind"] == "model_turn" for c in e["body"]["tool_calls"]]
    assert [(c["name"], c.get("sent_name")) for c in calls] == [
        ("query_data_source", "functions.query_data_source"),
        ("save_report", leaked),
    ]
    results = [(e["tool_name"], e["status"]) for e in entries if e["kind"] == "tool_result"]
    assert results == [("query_data_source", "succeeded"), ("save_report", "succeeded")]
    saved = next(e["body"]["result"] for e in entries if e.get("tool_name") == "save_report")
    assert saved["outcome"] == "completed"
