"""`query_data_source` in a small context window (`LLM_CONTEXT_WINDOW=4096`, a local 4k model),
a real round through the real `openai` client against the loopback server.

Before, the result was shown whole (the bundled simulator's day of readings is about 3,600
tokens) and the round failed `context_overflow` at its next request. Now the tool shows the rows
that fit (a quarter of the window at most, and what the tool definitions and the prompt leave),
says `truncated` with why, and the host's evidence record says exactly what the model saw
(invariant 12: a truncated result cannot support a claim about the whole range). A window the
kept parts alone overflow fails the round with one line that says which settings make room.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.evidence import Citation
from orchestrator.agent.repeats import SAME_FAILURE_LIMIT
from orchestrator.domain.times import wire_time
from orchestrator.services.task_records import TaskRecords
from orchestrator.services.tasks import Trigger
from orchestrator.store.evidence import content_ref
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for
from tests.integration.fake_backend import gateway_overrides, running_backend
from tests.openai_server import OpenAIServer, Reply, call

KEY = "sk-test-small-window"


#: A server that reports no prompt size: the local count stays uncalibrated (the loopback
#: server's own count leaves the tool definitions out, which would make them look cheap).
NO_USAGE = (0, 5)


def _run(
    store_url: str,
    scripts: Path,
    server: OpenAIServer,
    window: int,
    *,
    query: dict[str, Any] | None = None,
    sample: Any = None,
    also: dict[str, Any] | None = None,
    calls: list[dict[str, Any]] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """One round that queries a data source (a day of turbidity readings unless `query` says
    otherwise, of a task with `sample` as its sample input; `also` a second query in the same
    turn; `calls` the turn's calls instead): what the model was shown
    of it (of each, `shown_all`), the host's evidence records, and the task's last error."""
    settings: dict[str, Any] = {"llm_max_output_tokens": 512, **overrides}
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=KEY,
        llm_context_window=window,
        **settings,
    )
    try:
        day = {"source": "scada_sim", "parameters": {"point": "DM-RN-01", "measure": "turbidity"}}
        if calls is None:
            calls = [call("q1", "query_data_source", query or day)]
            if also is not None:
                calls.append(call("q2", "query_data_source", also))
        server.reply(tool_calls=calls, usage=NO_USAGE)
        server.reply(content="looked at it", usage=NO_USAGE)
        trigger = Trigger(task_type="looks", title="turbid water", sample_input=sample)
        task_id = rt.tasks.trigger(trigger).task.task_id
        rt.executions.run(task_id, 1, worker="w1")
        error = rt.tasks.get(task_id).last_error
        records = TaskRecords(rt.db).evidence(task_id)["items"]
        bodies = server.bodies
        answers = [m for m in bodies[1]["messages"] if m["role"] == "tool"] if bodies[1:] else []
        told = [json.loads(answer["content"]) for answer in answers]
        shown_all = [answer.get("result") for answer in told]
        shown = shown_all[-1] if shown_all else None
        return {
            "error": error,
            "records": records,
            "shown": shown,
            "shown_all": shown_all,
            "told": told,
        }
    finally:
        rt.close()


def test_a_day_of_readings_fits_a_4096_token_window_and_says_it_is_cut(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    seen = _run(store_url, scripts, server, 4096)
    assert seen["error"] is None
    shown, [record] = seen["shown"], seen["records"]
    rows = shown["rows"]
    assert 0 < len(rows) < 144  # a day every 10 minutes: 144 readings
    assert shown["row_count"] == len(rows)
    assert shown["truncated"] is True
    said = f"the context window (LLM_CONTEXT_WINDOW) takes {len(rows)} of 14"  # 144 or 145
    assert said in shown["truncation"]
    # The host's record is what the model saw: truncated, with as many rows.
    assert (record["truncated"], record["row_count"]) == (True, len(rows))
    # Whole rows from the start of the range; the next one's time is named to query on from.
    next_time = shown["truncation"].split("the next row's time is ")[1].split(")")[0]
    assert next_time > rows[-1]["time"]


#: The host's record beside a result at its largest: values as long as an evidence id, a time
#: with microseconds and a SHA-256 reference, each byte a token (`~|` is two tokens). A real
#: record takes fewer, and how many depends on its random id and hash: a day's round in this
#: window failed `context_overflow` about one time in twenty when they tokenized long.
WORST = Citation("~|" * 18, "~|" * 16, "~|" * 35 + "~")


def test_the_rows_leave_room_for_the_hosts_record_at_its_largest(
    store_url: str, scripts: Path, server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (len(WORST.evidence_id), len(WORST.queried_at)) == (36, len(wire_time(utcnow())))
    assert len(WORST.content_ref) == len(content_ref("0" * 64))
    monkeypatch.setattr("orchestrator.agent.evidence._citation", lambda *_: WORST)
    seen = _run(store_url, scripts, server, 4096)
    assert seen["error"] is None
    assert seen["shown"]["truncated"] is True
    assert 0 < len(seen["shown"]["rows"]) < 144


PRESSURE = {"source": "scada_sim", "parameters": {"point": "DM-RN-02", "measure": "pressure"}}


def test_two_queries_in_one_turn_share_the_room(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Each query was fitted to the whole room the kept parts leave, so two together
    overflowed it and the round failed `context_overflow`."""
    seen = _run(store_url, scripts, server, 6144, also=PRESSURE)
    assert seen["error"] is None
    assert len(seen["shown_all"]) == len(seen["records"]) == 2
    for shown in seen["shown_all"]:
        assert shown["truncated"] is True
        assert 0 < len(shown["rows"]) < 144
    assert sorted(record["row_count"] for record in seen["records"]) == sorted(
        len(shown["rows"]) for shown in seen["shown_all"]
    )


FLOW = {"source": "scada_sim", "parameters": {"point": "DM-HS-01", "measure": "pressure"}}
DAY = {"source": "scada_sim", "parameters": {"point": "DM-RN-01", "measure": "turbidity"}}


@pytest.mark.parametrize("worst", [False, True])
@pytest.mark.parametrize("count", [2, 3])
def test_queries_a_4096_window_cannot_hold_together_wait_for_a_later_turn(
    store_url: str,
    scripts: Path,
    server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
    worst: bool,
) -> None:
    """Each result of a turn needs room of its own (the tool message, the host's record and
    the rows' envelope), and in 4,096 tokens the task tools' definitions leave room for one.
    Before, three queries in one turn (and two whose records tokenized long) overflowed the
    next request and the round failed `context_overflow`; two others were shown none of their
    rows. Now the first runs with rows, and the others are not run: they answer `no_room`, say
    how many calls of a turn the window holds, and leave no evidence record."""
    if worst:
        monkeypatch.setattr("orchestrator.agent.evidence._citation", lambda *_: WORST)
    queries = [DAY, PRESSURE, FLOW][:count]
    calls = [call(f"q{n}", "query_data_source", query) for n, query in enumerate(queries, 1)]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    first, *others = seen["told"]
    assert first["status"] == "succeeded"
    rows = first["result"]["rows"]
    assert 0 < len(rows) < 144
    assert first["result"]["truncated"] is True
    for answer in others:
        assert (answer["status"], answer["code"]) == ("failed", "no_room")
        assert answer["message"] == (
            f"not run: the context window (4096 tokens) holds the results of 1 of this turn's "
            f"{count} calls; make this call again in a later turn, at most 1 call a turn"
        )
        assert "evidence_id" not in answer
    # Only what ran is recorded, as the model saw it.
    [record] = seen["records"]
    cited = WORST.evidence_id if worst else record["evidence_id"]  # the model's, at its longest
    assert first["evidence_id"] == cited
    assert (record["truncated"], record["row_count"]) == (True, len(rows))


def test_small_reads_that_record_no_evidence_all_run_in_a_4096_window(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Four receipt look-ups in one turn: each answer is about 51 tokens (a found receipt at
    most 178), and the task tools' definitions leave about 740. Before, each was reserved the
    host's evidence record too (about 160 tokens: its keys and their 139 characters), which a
    tool that records none never shows, and three were answered no_room; now all four run."""
    calls = [call(f"g{n}", "get_tool_execution", {"invocation_id": f"inv-{n}"}) for n in range(4)]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    assert [answer.get("code") for answer in seen["told"]] == ["not_found"] * 4
    assert seen["records"] == []


def test_a_look_up_smaller_than_the_no_room_answer_is_answered(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Two queries and a receipt look-up in one turn, in a 4,096-token window: the first query
    runs, and the second and the look-up were answered no_room (about 82 tokens each), though
    the look-up's answer (about 51 tokens, not found) takes less room than that: holding it
    back saved nothing. Now a look-up (`Tool.look_up`) the window has no room for runs all the
    same, and its answer is shown when it takes no more room than the no_room answer."""
    calls = [
        call("q1", "query_data_source", DAY),
        call("q2", "query_data_source", PRESSURE),
        call("g1", "get_tool_execution", {"invocation_id": "inv-1"}),
    ]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    day, pressure, looked = seen["told"]
    assert 0 < len(day["result"]["rows"]) < 144
    assert (pressure["code"], pressure["message"]) == (
        "no_room",
        "not run: the context window (4096 tokens) holds the results of 1 of this turn's 3 "
        "calls; make this call again in a later turn, at most 1 call a turn",
    )
    assert (looked["code"], looked["message"]) == (
        "not_found",
        "no invocation 'inv-1' for this conversation",
    )
    [record] = seen["records"]
    assert day["evidence_id"] == record["evidence_id"]


def test_a_turn_whose_no_room_answers_do_not_fit_ends_in_a_request_that_fits(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A day's query, a pressure query and two receipt look-ups in one turn of a 4,096-token
    window: the day's query at its least leaves about 220 tokens, and the three no_room answers
    (about 82 each) take more, so no number of reads fit, every call ran and the next request
    failed `context_overflow`. Now the reads left after the first are answered a shorter fixed
    refusal: the pressure query is told how many calls the window holds, the look-ups (which
    run all the same) are shown or told they were not, and only the day's query is recorded."""
    calls = [
        call("q1", "query_data_source", DAY),
        call("q2", "query_data_source", PRESSURE),
        call("g1", "get_tool_execution", {"invocation_id": "inv-1"}),
        call("g2", "get_tool_execution", {"invocation_id": "inv-2"}),
    ]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    day, pressure, *looked = seen["told"]
    # Few rows if any (the day's query at its least takes most of the room), and it says so.
    rows = day["result"]["rows"]
    assert day["result"]["truncated"] is True
    assert "the context window (LLM_CONTEXT_WINDOW) takes " in day["result"]["truncation"]
    assert (pressure["code"], pressure["message"]) == (
        "no_room",
        "not run: the context window (4096 tokens) holds the results of 1 of this turn's 4 "
        "calls; make this call again in a later turn, at most 1 call a turn",
    )
    for n, answer in enumerate(looked, 1):
        assert (answer["code"], answer["message"]) in {
            ("not_found", f"no invocation 'inv-{n}' for this conversation"),
            ("no_room", SHORT_NOT_SHOWN),
        }
    [record] = seen["records"]
    assert (record["evidence_id"], record["row_count"]) == (day["evidence_id"], len(rows))


def test_a_days_query_beside_look_ups_gets_the_room_they_leave(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A day's query and two receipt look-ups in one turn of a 4,096-token window: each call
    was given an equal share of the room (or its no_room answer's), and the day's query showed
    no row though each look-up's answer takes about 51 tokens. Now the look-ups run first and
    the day's rows are fitted to the room their answers leave."""
    calls = [
        call("q1", "query_data_source", DAY),
        call("g1", "get_tool_execution", {"invocation_id": "inv-1"}),
        call("g2", "get_tool_execution", {"invocation_id": "inv-2"}),
    ]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None  # the next request fits
    day, *looked = seen["told"]
    rows = day["result"]["rows"]
    assert 2 <= len(rows) < 144  # 3 in this window
    for n, answer in enumerate(looked, 1):
        assert (answer["code"], answer["message"]) == (
            "not_found",
            f"no invocation 'inv-{n}' for this conversation",
        )
    [record] = seen["records"]
    assert (record["evidence_id"], record["row_count"]) == (day["evidence_id"], len(rows))


def test_a_look_up_made_first_does_not_take_the_place_of_a_query(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A look-up, a day's query, a look-up and a pressure query in one turn of a 4,096-token
    window: the window holds one read's result beside the others' answers, and that was the
    first in call order, the look-up, though a look-up runs anyway: both queries were answered
    no_room. The queries now come before the look-ups for the reads the window holds: the
    day's query runs, the pressure query waits, and the look-ups are answered as they ran."""
    calls = [
        call("g1", "get_tool_execution", {"invocation_id": "inv-1"}),
        call("q1", "query_data_source", DAY),
        call("g2", "get_tool_execution", {"invocation_id": "inv-2"}),
        call("q2", "query_data_source", PRESSURE),
    ]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    first, day, second, pressure = seen["told"]
    assert day["status"] == "succeeded"
    assert day["result"]["truncated"] is True
    assert (pressure["code"], pressure["message"]) == (
        "no_room",
        "not run: the context window (4096 tokens) holds the results of 1 of this turn's 4 "
        "calls; make this call again in a later turn, at most 1 call a turn",
    )
    for n, answer in ((1, first), (2, second)):
        assert (answer["code"], answer["message"]) == (
            "not_found",
            f"no invocation 'inv-{n}' for this conversation",
        )
    [record] = seen["records"]
    assert (record["evidence_id"], record["row_count"]) == (
        day["evidence_id"],
        len(day["result"]["rows"]),
    )


def test_a_turn_too_large_for_its_first_query_beside_the_others_waits_whole(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Three queries and two look-ups in one turn of a 4,096-token window: the turn's own
    message (about 35 tokens a call) and the others' answers, told in as few words as they
    are, leave the first query no room, though it fits a turn of its own. Every call ran and
    the next request failed `context_overflow`; now no query runs, each is told to come in a
    later turn, one a turn, and the look-ups are answered as they ran."""
    calls = [
        call("q1", "query_data_source", DAY),
        call("q2", "query_data_source", PRESSURE),
        call("q3", "query_data_source", FLOW),
        call("g1", "get_tool_execution", {"invocation_id": "inv-1"}),
        call("g2", "get_tool_execution", {"invocation_id": "inv-2"}),
    ]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    none = (
        "not run: the context window (4096 tokens) holds the results of none of this turn's 5 "
        "calls together; make this call again in a later turn, at most 1 call a turn"
    )
    first, *others = seen["told"][:3]
    assert (first["code"], first["message"]) == ("no_room", none)
    for answer in others:
        assert answer["code"] == "no_room"
        assert answer["message"] in {none, SHORT_NOT_SHOWN.replace("not shown", "not run")}
    for n, answer in enumerate(seen["told"][3:], 1):
        assert answer["code"] in {"not_found", "no_room"}
        assert answer["message"] in {
            f"no invocation 'inv-{n}' for this conversation",
            SHORT_NOT_SHOWN,
        }
    assert seen["records"] == []


#: What a look-up left after the first call left for a later turn is answered when its own
#: answer takes more room (`turn_room.no_room(..., short=True, ran=True)`).
SHORT_NOT_SHOWN = "not shown: no room in this turn; make it again in a later turn, with fewer calls"


def test_a_query_of_an_unknown_source_needs_no_room_for_a_record(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A query of a source that is not declared is refused (about 30 tokens) and records
    nothing. Before, it was reserved the host's evidence record's room (about 160 tokens) as a
    declared source's query is, and beside it a day's query in a 4,096-token window was shown
    none of its rows; now the day's rows have that room, and the refusal says which sources
    are declared."""
    unknown = {"source": "scada_live", "parameters": {"point": "DM-RN-01"}}
    calls = [call("q1", "query_data_source", DAY), call("q2", "query_data_source", unknown)]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    day, refused = seen["told"]
    assert 0 < len(day["result"]["rows"]) < 144
    assert (refused["status"], refused["code"]) == ("failed", "unknown_source")
    assert "declared: scada_sim" in refused["message"]
    [record] = seen["records"]
    assert day["evidence_id"] == record["evidence_id"]


def test_a_days_query_beside_a_refused_query_gets_the_room_the_refusal_leaves(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A query of an undeclared source is refused at once (about 30 tokens): beside it a day's
    query was given half the room and showed 1 row in a 4,096-token window (6 alone). The
    refusal now runs first, as a look-up does, and the day's rows have the room it leaves."""
    unknown = {"source": "scada_live", "parameters": {"point": "DM-RN-01"}}
    calls = [call("q1", "query_data_source", DAY), call("q2", "query_data_source", unknown)]
    seen = _run(store_url, scripts, server, 4096, calls=calls)
    assert seen["error"] is None
    day, refused = seen["told"]
    assert 3 <= len(day["result"]["rows"]) < 144
    assert (refused["status"], refused["code"]) == ("failed", "unknown_source")
    [record] = seen["records"]
    assert (record["evidence_id"], record["row_count"]) == (
        day["evidence_id"],
        len(day["result"]["rows"]),
    )


def test_a_window_that_holds_not_even_one_query_says_the_turn_made_several_calls(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """1,024 tokens reserved for the answer leave no room for even one query's result beside
    the turn: every call runs, as before, and the round fails `context_overflow`; the line
    says the turn made three calls (before, it named the largest result alone)."""
    calls = [call(f"q{n}", "query_data_source", q) for n, q in enumerate([DAY, PRESSURE, FLOW], 1)]
    seen = _run(store_url, scripts, server, 4096, calls=calls, llm_max_output_tokens=1024)
    error = seen["error"]
    assert error is not None
    assert error.startswith("the context window of 4096 tokens is too small")
    assert "(3 tool calls in one turn, each result with room of its own: a model that" in error
    assert "lower LLM_MAX_OUTPUT_TOKENS (it reserves 1024 tokens" in error
    assert len(seen["records"]) == 3  # every call ran: none was answered no_room


def _turns(
    store_url: str, scripts: Path, server: OpenAIServer, turns: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """A round in a 4,096-token window whose model makes `turns` (each a list of calls), then
    answers: what it was told after each turn, the task's records and its last error."""
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=KEY,
        llm_context_window=4096,
        llm_max_output_tokens=512,
    )
    try:
        replies = [Reply(tool_calls=calls, usage=NO_USAGE) for calls in turns]
        replies.append(Reply(content="looked at it", usage=NO_USAGE))

        def answer(body: dict[str, Any]) -> Reply:
            # Each turn's result fills the window: the next request compacts the one before
            # with a summary call, which must not take the model's next turn.
            if body["messages"][0]["content"].startswith("Summarise"):
                return Reply(content="queried the sources", usage=NO_USAGE)
            return replies.pop(0) if replies else Reply(content="done", usage=NO_USAGE)

        for _ in range(2 * len(replies)):  # one answer each: a turn and its summary call
            server.dynamic(answer)
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        rt.executions.run(task_id, 1, worker="w1")
        view = rt.tasks.explain(task_id)
        records = TaskRecords(rt.db).evidence(task_id)["items"]
    finally:
        rt.close()
    bodies = [b for b in server.bodies if not b["messages"][0]["content"].startswith("Summarise")]
    told = []
    for body, calls in zip(bodies[1:], turns, strict=False):
        answers = [m for m in body["messages"] if m["role"] == "tool"][-len(calls) :]
        told.append([json.loads(answer["content"]) for answer in answers])
    return {"view": view, "records": records, "told": told, "requests": len(bodies)}


def test_a_model_that_makes_the_rest_in_later_turns_gets_every_query(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Three queries, then the two left, then the last: each turn runs its first call, and the
    round ends as the model ends it, with a record of each query as the model saw it."""
    q1, q2, q3 = (
        call(f"q{n}", "query_data_source", q) for n, q in enumerate([DAY, PRESSURE, FLOW], 1)
    )
    q2b, q3b, q3c = (
        dict(q, id=f"{q['id']}{turn}") for q, turn in ((q2, "b"), (q3, "b"), (q3, "c"))
    )
    seen = _turns(store_url, scripts, server, [[q1, q2, q3], [q2b, q3b], [q3c]])
    assert seen["view"]["last_error"] is None
    codes = [[answer.get("code") for answer in turn] for turn in seen["told"]]
    assert codes == [[None, "no_room", "no_room"], [None, "no_room"], [None]]
    assert "holds the results of 1 of this turn's 2 calls" in seen["told"][1][1]["message"]
    ran = [turn[0] for turn in seen["told"]]
    assert [answer["result"]["source"] for answer in ran] == ["scada_sim"] * 3
    by_id = {record["evidence_id"]: record for record in seen["records"]}
    assert sorted(by_id) == sorted(answer["evidence_id"] for answer in ran)
    for answer in ran:
        record = by_id[answer["evidence_id"]]
        assert (record["truncated"], record["row_count"]) == (
            answer["result"]["truncated"],
            len(answer["result"]["rows"]),
        )


def test_a_model_that_sends_the_same_three_queries_every_turn_is_stopped(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """The first query runs each time, the two after it never do: the model is stuck, as one
    that repeats a refused call is, and the task ends model_error naming it after 3 turns, not
    ORCH_MAX_TURNS."""
    calls = [call(f"q{n}", "query_data_source", q) for n, q in enumerate([DAY, PRESSURE, FLOW], 1)]
    seen = _turns(store_url, scripts, server, [calls] * 10)
    view = seen["view"]
    assert view["failure_code"] == "model_error"
    assert view["last_error"].startswith(
        f"the model made the same refused call {SAME_FAILURE_LIMIT} turns in a row, shown why "
        "each time: query_data_source: no_room: not run: the context window (4096 tokens) "
        "holds the results of 1 of this turn's 3 calls"
    )
    assert seen["requests"] == SAME_FAILURE_LIMIT


@pytest.mark.parametrize(("window", "count"), [(4096, 2), (6144, 3)])
def test_large_results_previewed_in_one_turn_share_the_room(
    store_url: str, scripts: Path, server: OpenAIServer, window: int, count: int
) -> None:
    """A large result was shown as a preview of a tenth of the window, whatever the rest of the
    request left, and measured as a JSON string alone though it is shown inside the result's
    JSON (a third more, for quoted text): two in one turn (a sample input of 2,000 readings,
    read twice) overflowed a 4,096-token window, and three a 6,144-token one, and the round
    failed `context_overflow`."""
    calls = [call(f"c{n}", "read_task_context", {}) for n in range(count)]
    seen = _run(store_url, scripts, server, window, calls=calls, sample={"readings": READINGS})
    assert seen["error"] is None
    assert len(seen["shown_all"]) == count
    for shown in seen["shown_all"]:
        assert shown["truncated"] is True
        assert 0 < len(shown["preview"]) < shown["total_chars"]


@pytest.mark.parametrize("count", [5, 6])
def test_a_preview_shows_enough_to_act_on_or_the_read_waits(
    store_url: str, scripts: Path, server: OpenAIServer, count: int
) -> None:
    """Five or six reads of the task's context (about 2,300 characters each) in one turn of a
    4,096-token window: each was reserved a preview's keys alone, and each preview showed
    `{"task_id"` (five) or `{` (three of six, the others no_room), which tells the model
    nothing. Now a read runs only with room for a preview worth showing (its first keys and
    values), and the others are answered no_room, to be made in a later turn."""
    calls = [call(f"c{n}", "read_task_context", {}) for n in range(count)]
    seen = _run(store_url, scripts, server, 4096, calls=calls, sample={"readings": READINGS[:40]})
    assert seen["error"] is None
    shown = [answer for answer in seen["told"] if answer.get("code") != "no_room"]
    assert 0 < len(shown) < count
    for answer in shown:
        preview = answer["result"]
        assert '"task_type": "looks"' in preview["preview"]
        assert preview["next_offset"] == len(preview["preview"])
        assert preview["note"] == "read the rest with read_tool_result(result_id, offset)"
    for answer in seen["told"][len(shown) :]:
        assert answer["code"] == "no_room"


def test_the_default_window_shows_the_whole_day(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    seen = _run(store_url, scripts, server, 32768, llm_max_output_tokens=4096)
    assert seen["error"] is None
    shown, [record] = seen["shown"], seen["records"]
    assert shown["truncated"] is False
    assert len(shown["rows"]) >= 144
    assert (record["truncated"], record["row_count"]) == (False, len(shown["rows"]))


def test_tool_definitions_too_large_for_the_window_name_the_settings_that_make_room(
    store_url: str, scripts: Path, server: OpenAIServer, tmp_path: Path
) -> None:
    """The business API's tools and the command tool beside the task tools: about 3,000 tokens
    of definitions, over the 3,072 a 4,096-token window with 1,024 for the answer lets a request
    use. Before, the line gave the sizes and named no setting."""
    with running_backend() as backend:
        overrides = gateway_overrides(tmp_path, backend, enable_command_tool=True)
        seen = _run(store_url, scripts, server, 4096, llm_max_output_tokens=1024, **overrides)
    error = seen["error"]
    assert error is not None
    assert error.startswith("the context window of 4096 tokens is too small")
    assert "lower LLM_MAX_OUTPUT_TOKENS (it reserves 1024 tokens" in error
    assert "set LLM_MAX_TOOLS (e.g. 4" in error
    assert "raise LLM_CONTEXT_WINDOW" in error
    assert "\n" not in error
    assert seen["shown"] is None  # no call was made
    assert seen["records"] == []


def test_with_the_business_api_trimmed_the_rows_leave_room_for_its_tools(
    store_url: str, scripts: Path, server: OpenAIServer, tmp_path: Path
) -> None:
    """As the line advises: LLM_MAX_TOOLS=4 and 512 tokens for the answer. The kept parts then
    take most of the request; a quarter of the window beside them would overflow it."""
    with running_backend() as backend:
        overrides = gateway_overrides(tmp_path, backend, enable_command_tool=True, llm_max_tools=4)
        seen = _run(store_url, scripts, server, 4096, **overrides)
    assert seen["error"] is None
    shown, [record] = seen["shown"], seen["records"]
    assert shown["truncated"] is True
    assert (record["truncated"], record["row_count"]) == (True, len(shown["rows"]))


def _run_sample(store_url: str, scripts: Path, server: OpenAIServer, sample: Any) -> dict[str, Any]:
    """One round in an 8,192-token window that queries the task's sample input."""
    return _run(store_url, scripts, server, 8192, query={"source": "sample_input"}, sample=sample)


#: A sample input of 2,000 readings (about 60,000 tokens): what a backend may well send.
READINGS = [
    {"t": n, "turbidity": round(0.1 * n, 1), "note": f"第{n}号 读数正常"} for n in range(2000)
]


def test_a_large_sample_input_shows_the_items_that_fit_and_names_the_rest(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Before, the sample input was shown whole and the round failed `context_overflow`."""
    sample = {"site": "tap 3", "readings": READINGS}
    seen = _run_sample(store_url, scripts, server, sample)
    assert seen["error"] is None
    shown, [record] = seen["shown"], seen["records"]
    [row] = shown["rows"]
    kept = row["readings"]
    assert 0 < len(kept) < 2000
    assert row == {"site": "tap 3", "readings": READINGS[: len(kept)]}  # leading items, whole
    assert (shown["origin"], shown["truncated"]) == ("peripheral_sample", True)
    said = f"takes {len(kept)} of the 2000 items of the sample input's 'readings': items "
    assert said + f"{len(kept) + 1} to 2000 are not shown" in shown["truncation"]
    assert "read_task_context returns the sample input whole" in shown["truncation"]
    assert (record["truncated"], record["row_count"]) == (True, 1)


def test_a_sample_input_without_a_list_to_cut_says_none_of_it_is_shown(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    seen = _run_sample(store_url, scripts, server, {"log": json.dumps(READINGS)})
    assert seen["error"] is None
    shown = seen["shown"]
    assert (shown["rows"], shown["truncated"]) == ([], True)
    assert "takes 0 of the sample input's 1 rows: its one row (" in shown["truncation"]


def test_a_small_sample_input_is_shown_whole(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    sample = {"readings": READINGS[:5]}
    seen = _run_sample(store_url, scripts, server, sample)
    shown = seen["shown"]
    assert (shown["rows"], shown["truncated"], shown["row_count"]) == ([sample], False, 1)
    assert "never present it as a live query" in shown["note"]
