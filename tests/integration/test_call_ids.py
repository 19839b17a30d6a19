"""Tool-call ids as real servers send them, through the real `openai` client and loopback server.

Some servers number their ids per turn (Text Generation Inference sends `"0"`, others `call_0`,
in every reply); with the host's rule for a repeated id (seed 000: the same call id with other
arguments is refused) every call after the first turn was refused `invocation_conflict` and
no task could finish. The client scopes such ids to their turn; an id a server with ids of its
own per call repeats from an earlier turn is still the model's, refused with other arguments
and deduplicated with the same. The write tool is an ordinary one (its receipt identity is the
call id), with real receipts.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from pydantic import Field

from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.store import Database
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from tests.integration.receipt_rows import chat_session
from tests.integration.test_openai_model import model_for
from tests.openai_server import OpenAIServer, call


class NoteArgs(ToolArguments):
    text: str = Field(min_length=1)


class WriteNote(Tool):
    """An ordinary write (identity = the call id): a note on the site's log book."""

    name = "write_note"
    description = "Write a note in the site's log book."
    effect = "write"
    arguments = NoteArgs

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.lock = threading.Lock()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        with self.lock:
            self.ran.append(args.text)
        return ToolResult.ok({"written": args.text})


class Recorder:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.results: list[ToolResult] = []

    def model_turn(self, turn_number: int, message: dict[str, Any], turn: Any) -> None:
        pass

    def tool_results(
        self, turn_number: int, calls: list[ToolCall], results: list[ToolResult]
    ) -> None:
        self.calls.extend(calls)
        self.results.extend(results)


@pytest.fixture
def ledger(db: Database) -> ReceiptLedger:
    return ReceiptLedger(db)


def _round(
    server: OpenAIServer,
    ledger: ReceiptLedger,
    turns: list[list[tuple[str, str]]],
    *,
    tool: WriteNote | None = None,
    session: str | None = None,
    round_id: str = "r1",
    generation: int | None = None,
) -> tuple[WriteNote, Recorder]:
    """Play `turns` (each a list of (server's call id, note text)) and end the round (of
    `session`, a new chat's by default)."""
    for notes in turns:
        server.reply(tool_calls=[call(cid, "write_note", {"text": text}) for cid, text in notes])
    server.reply(content="noted")
    tool = tool or WriteNote()
    recorder = Recorder()
    session = session or chat_session(ledger.db)
    ctx = ToolContext(owner="alice", session_id=session, round_id=round_id, generation=generation)
    end = run_round(
        model_for(server),
        ToolHost([tool], ledger=ledger),
        ctx,
        brief="note what you see",
        max_turns=len(turns) + 2,
        stop=threading.Event(),
        recorder=recorder,
    )
    assert end.why == "final_answer"
    # The strict server accepted every history: each call named once and answered once.
    assert all(r.refused is None for r in server.requests)
    return tool, recorder


@pytest.mark.parametrize("first", ["0", "call_0"])
def test_a_server_numbering_its_ids_per_turn_has_every_turn_run(
    server: OpenAIServer, ledger: ReceiptLedger, first: str
) -> None:
    second = first[:-1] + "1"
    tool, recorder = _round(
        server,
        ledger,
        [
            [(first, "valve 3 closed")],
            [(first, "pump 2 restarted"), (second, "meter read")],
            [(first, "valve 3 closed")],  # the same note again is a new call, not a replay
        ],
    )
    assert [r.status for r in recorder.results] == ["succeeded"] * 4
    # The calls of one turn run concurrently, in any order.
    assert sorted(tool.ran) == [
        "meter read",
        "pump 2 restarted",
        "valve 3 closed",
        "valve 3 closed",
    ]
    ids = [c.id for c in recorder.calls]
    assert len(set(ids)) == 4
    # Each scoped to the round and its turn, the first turn's too (the next generation counts
    # from 0 again in the same session).
    assert ids[0].startswith(f"{first}~")
    assert all("~" in i for i in ids)
    invocations = {r.invocation_id for r in recorder.results}
    assert len(invocations) == 4


def test_ids_the_model_repeats_from_an_earlier_turn_are_still_judged_by_the_host(
    server: OpenAIServer, ledger: ReceiptLedger
) -> None:
    tool, recorder = _round(
        server,
        ledger,
        [
            [("call_a1", "valve 3 closed")],
            [("call_b2", "pump 2 restarted")],  # a fresh id: the server's ids are its own
            [("call_a1", "valve 4 closed")],  # an earlier call's id with other arguments
            [("call_a1", "valve 3 closed")],  # an earlier call replayed as it was
        ],
    )
    statuses = [(r.status, r.code) for r in recorder.results]
    assert statuses[:2] == [("succeeded", None), ("succeeded", None)]
    assert statuses[2] == ("failed", "invocation_conflict")
    assert statuses[3] == ("succeeded", "already_claimed")
    assert recorder.results[3].invocation_id == recorder.results[0].invocation_id
    assert tool.ran == ["valve 3 closed", "pump 2 restarted"]


def test_missing_ids_are_the_host_s_own_and_never_meet(
    server: OpenAIServer, ledger: ReceiptLedger
) -> None:
    tool, recorder = _round(
        server, ledger, [[("", "valve 3 closed")], [("", "pump 2 restarted"), ("", "meter read")]]
    )
    assert [r.status for r in recorder.results] == ["succeeded"] * 3
    assert len({c.id for c in recorder.calls}) == 3
    assert sorted(tool.ran) == ["meter read", "pump 2 restarted", "valve 3 closed"]


def test_the_host_s_own_ids_fit_mistral_s_template(ledger: ReceiptLedger) -> None:
    """A Mistral-template server that sends no ids refuses every history with an id that is not
    9 letters and digits; the host's own ids (`call_<tag>_<turn>_<n>`) were refused at the
    second request, failing the round. They are now of that form, and still never meet."""
    with OpenAIServer(mistral=True) as mistral:
        tool, recorder = _round(
            mistral,
            ledger,
            [[("", "valve 3 closed")], [("", "pump 2 restarted"), ("", "meter read")]],
        )
    assert [r.status for r in recorder.results] == ["succeeded"] * 3
    ids = [c.id for c in recorder.calls]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"[a-zA-Z0-9]{9}", call_id) for call_id in ids)
    assert sorted(tool.ran) == ["meter read", "pump 2 restarted", "valve 3 closed"]


def test_a_numbering_server_s_repeat_within_one_turn_is_still_refused(
    server: OpenAIServer, ledger: ReceiptLedger
) -> None:
    """Scoping is across turns only: two calls of one reply under one id are answered
    `failed` without running, whether or not the id was scoped."""
    tool, recorder = _round(
        server, ledger, [[("0", "valve 3 closed")], [("0", "pump 2 restarted"), ("0", "x")]]
    )
    assert [r.status for r in recorder.results] == ["succeeded", "succeeded", "failed"]
    assert "repeated in this turn" in (recorder.results[2].message or "")
    assert sorted(tool.ran) == ["pump 2 restarted", "valve 3 closed"]


@pytest.mark.parametrize("text", ["valve 4 closed", "valve 3 closed"])
def test_an_id_the_model_repeats_in_the_very_next_turn_is_judged_by_the_host(
    server: OpenAIServer, ledger: ReceiptLedger, text: str
) -> None:
    """An id of the server's own (not a per-turn counter) repeated in the second turn is the
    model's: with other arguments it is refused, with the same it is the first call again. It
    must not pass for a server numbering its ids per turn (the second turn starting its ids as
    the first did), which would scope it to its turn and run the write a second time."""
    tool, recorder = _round(server, ledger, [[("call_a1", "valve 3 closed")], [("call_a1", text)]])
    assert [c.id for c in recorder.calls] == ["call_a1", "call_a1"]
    assert tool.ran == ["valve 3 closed"]
    if text == "valve 3 closed":
        assert (recorder.results[1].status, recorder.results[1].code) == (
            "succeeded",
            "already_claimed",
        )
        assert recorder.results[1].invocation_id == recorder.results[0].invocation_id
    else:
        assert (recorder.results[1].status, recorder.results[1].code) == (
            "failed",
            "invocation_conflict",
        )


@pytest.mark.parametrize(
    "ids", [["1"], ["call_1", "call_2"], ["functions.write_note:0"], ["tool-0", "tool-1"]]
)
def test_counters_of_other_shapes_are_scoped_too(
    server: OpenAIServer, ledger: ReceiptLedger, ids: list[str]
) -> None:
    """Counters from 0 or 1 after any prefix (`call_1`, Kimi's `functions.NAME:0`) are a
    server's numbering: every turn's calls run."""
    turns = [[(cid, f"note {turn}.{n}") for n, cid in enumerate(ids)] for turn in range(3)]
    tool, recorder = _round(server, ledger, turns)
    assert [r.status for r in recorder.results] == ["succeeded"] * (3 * len(ids))
    assert len(tool.ran) == 3 * len(ids)
    assert len({c.id for c in recorder.calls}) == 3 * len(ids)


@pytest.mark.parametrize("first", ["0", "call_0"])
def test_a_numbering_server_s_ids_never_meet_the_last_generation_s(
    server: OpenAIServer, ledger: ReceiptLedger, first: str
) -> None:
    """A task's generations share one session, where an ordinary write's receipt is keyed by
    the call id, and a server numbering its ids per turn starts every generation at `0` again:
    the next generation's first note (`0`, and `0~t2` in its second turn) was refused
    `invocation_conflict`, and the same note as the last generation's was answered from that
    receipt without running. Every call of each generation runs."""
    session = chat_session(ledger.db)
    tool = WriteNote()
    results: list[ToolResult] = []
    for generation, notes in enumerate(
        (["valve 3 closed", "pump 2 restarted"], ["valve 4 closed", "valve 3 closed"])
    ):
        turns = [[(first, text)] for text in notes]
        _, recorder = _round(
            server, ledger, turns, tool=tool, session=session, round_id=f"intent:{generation}"
        )
        results.extend(recorder.results)
    assert [(r.status, r.code) for r in results] == [("succeeded", None)] * 4
    assert tool.ran == ["valve 3 closed", "pump 2 restarted", "valve 4 closed", "valve 3 closed"]
    assert len({r.invocation_id for r in results}) == 4


def test_ids_a_server_counts_over_the_conversation_never_meet_the_last_generation_s(
    server: OpenAIServer, ledger: ReceiptLedger
) -> None:
    """Kimi K2 numbers its calls over the conversation (`functions.write_note:0`, then `:1`):
    ids of its own from the second turn on, kept as sent, and the next generation of the task
    (the same session) sends them again. Its second note was refused `invocation_conflict`,
    and the same note as the last generation's answered from that receipt without running: a
    receipt of an execution is keyed by its generation too."""
    session = chat_session(ledger.db)
    tool = WriteNote()
    results: list[ToolResult] = []
    for generation, notes in ((1, ["valve 3 closed", "pump 2 restarted"]), (2, ["x", "y"])):
        turns = [[(f"functions.write_note:{n}", text)] for n, text in enumerate(notes)]
        _, recorder = _round(
            server, ledger, turns, tool=tool, session=session, generation=generation
        )
        results.extend(recorder.results)
    assert [(r.status, r.code) for r in results] == [("succeeded", None)] * 4
    assert tool.ran == ["valve 3 closed", "pump 2 restarted", "x", "y"]
