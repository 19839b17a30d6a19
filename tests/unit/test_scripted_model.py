"""The scripted model (`ORCH_MODEL=scripted:DIR`): loading, validation, playback, delays."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.model import ModelError, ModelTurn, ScriptedModel, load_model


def write(folder: Path, task_type: str, body: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task_type}.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
    return path


def call(call_id: str, name: str = "read_task_context", **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


THREE_TURNS = {
    "turns": [
        {"tool_calls": [call("c1")]},
        {"tool_calls": [call("c2", "save_report", summary="s", outcome="completed")]},
        {"content": "final answer"},
    ]
}


def play(model: Any, stop: threading.Event | None = None) -> ModelTurn:
    return model.next_turn([], [], stop or threading.Event())


def test_a_script_plays_its_turns_in_order_then_ends(scripts: Path) -> None:
    write(scripts, "leak", THREE_TURNS)
    model = load_model(f"scripted:{scripts}", "leak")
    first = play(model)
    assert not first.final
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("c1", "read_task_context", {})
    ]
    second = play(model)
    assert [(c.id, c.name) for c in second.tool_calls] == [("c2", "save_report")]
    assert second.tool_calls[0].arguments == {"summary": "s", "outcome": "completed"}
    third = play(model)
    assert third.final
    assert third.content == "final answer"
    # Past the end of the script the round ends with an empty final answer.
    after = play(model)
    assert after.final
    assert after.content is None
    assert after.tool_calls == ()


def test_a_new_load_starts_from_the_first_turn(scripts: Path) -> None:
    write(scripts, "leak", THREE_TURNS)
    spec = f"scripted:{scripts}"
    first_round = load_model(spec, "leak")
    assert play(first_round).tool_calls[0].id == "c1"
    assert play(first_round).tool_calls[0].id == "c2"
    second_round = load_model(spec, "leak")
    assert play(second_round).tool_calls[0].id == "c1"
    assert play(second_round).tool_calls[0].id == "c2"
    assert play(first_round).content == "final answer"  # the first one kept its own place


def test_json_that_does_not_parse_raises_a_clear_model_error(scripts: Path) -> None:
    path = write(scripts, "leak", '{"turns": [ {"content": "x"} ')
    with pytest.raises(ModelError) as caught:
        load_model(f"scripted:{scripts}", "leak")
    message = str(caught.value)
    assert str(path) in message
    assert "JSON" in message


def test_a_script_that_is_not_utf8_raises_a_model_error(scripts: Path) -> None:
    scripts.mkdir(parents=True)
    (scripts / "leak.json").write_bytes(b'{"turns": [{"content": "\xff\xfe"}]}')
    with pytest.raises(ModelError, match=r"leak\.json"):
        load_model(f"scripted:{scripts}", "leak")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({}, "turns"),
        ({"steps": []}, "turns"),  # the first problem found is named
        ({"turns": []}, "turns"),
        ({"turns": "read, then report"}, "turns"),
        ({"turns": [{"tool_calls": [{"id": "c1", "arguments": {}}]}]}, "name"),
        ({"turns": [{"tool_calls": [{"id": "c1", "name": ""}]}]}, "name"),
        ({"turns": [{"tool_calls": [{"name": "read_task_context"}]}]}, "id"),
        ({"turns": [{"delay_s": -1, "content": "x"}]}, "delay_s"),
        ({"turns": [{"delay_s": "soon", "content": "x"}]}, "delay_s"),
        ({"turns": [{"tool_calls": [call("c1") | {"arguments": []}]}]}, "arguments"),
        ({"turns": [{"content": "x", "thinking": "y"}]}, "thinking"),
        ([{"content": "x"}], ""),
    ],
)
def test_a_script_that_breaks_the_schema_raises_a_clear_model_error(
    scripts: Path, body: Any, where: str
) -> None:
    path = write(scripts, "leak", body)
    with pytest.raises(ModelError) as caught:
        load_model(f"scripted:{scripts}", "leak")
    message = str(caught.value)
    assert path.name in message
    assert where in message
    assert "malformed" in message


def test_a_missing_script_file_raises_a_clear_model_error(scripts: Path) -> None:
    write(scripts, "other", THREE_TURNS)
    with pytest.raises(ModelError) as caught:
        load_model(f"scripted:{scripts}", "leak")
    message = str(caught.value)
    assert str(scripts / "leak.json") in message
    assert "does not exist" in message


def test_a_missing_script_folder_raises_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"leak\.json"):
        load_model(f"scripted:{tmp_path / 'nowhere'}", "leak")


@pytest.mark.parametrize(
    "task_type", ["../x", "..", "sub/../../x", "ABSOLUTE", "a/b", "..\\x", "x\x00", ""]
)
def test_a_task_type_cannot_escape_the_script_folder(
    tmp_path: Path, scripts: Path, task_type: str
) -> None:
    write(scripts, "inside", THREE_TURNS)
    write(tmp_path, "x", THREE_TURNS)  # a valid script just outside the folder
    if task_type == "ABSOLUTE":
        task_type = str(tmp_path / "x")
    with pytest.raises(ModelError) as caught:
        load_model(f"scripted:{scripts}", task_type)
    message = str(caught.value)
    # Refused for its name, before any file outside the folder is looked up.
    assert repr(task_type) in message
    assert "does not exist" not in message


@pytest.mark.parametrize("spec", ["", "scripted", "scripted:", "openai:gpt", "SCRIPTED:/tmp"])
def test_an_unsupported_model_spec_raises_a_model_error(spec: str) -> None:
    with pytest.raises(ModelError, match="ORCH_MODEL"):
        load_model(spec, "leak")


def test_check_tools_names_the_unknown_tool_and_its_turn(scripts: Path) -> None:
    write(
        scripts,
        "leak",
        {"turns": [{"tool_calls": [call("c1")]}, {"tool_calls": [call("c2", "launch_missiles")]}]},
    )
    model = load_model(f"scripted:{scripts}", "leak")
    model.check_tools(["read_task_context", "launch_missiles"])
    with pytest.raises(ModelError) as caught:
        model.check_tools(["read_task_context", "save_report"])
    assert "launch_missiles" in str(caught.value)
    assert "turn 2" in str(caught.value)


def test_delay_s_is_the_thinking_time_before_the_turn(scripts: Path) -> None:
    write(
        scripts,
        "slow",
        {"turns": [{"content": "quick"}, {"delay_s": 0.4, "tool_calls": [call("c1")]}]},
    )
    model = load_model(f"scripted:{scripts}", "slow")
    started = time.monotonic()
    assert play(model).content == "quick"
    assert time.monotonic() - started < 0.2
    started = time.monotonic()
    turn = play(model)
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 2.0
    assert turn.tool_calls[0].id == "c1"


def test_a_delay_is_interrupted_by_the_stop_event(scripts: Path) -> None:
    write(scripts, "slow", {"turns": [{"delay_s": 30, "tool_calls": [call("c1")]}]})
    model = load_model(f"scripted:{scripts}", "slow")
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        turn = play(model, stop)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    assert 0.15 <= elapsed < 3.0
    # Stopped while thinking: an empty final answer, none of the turn's tool calls.
    assert turn.final
    assert turn.tool_calls == ()
    assert turn.content is None


def test_a_stop_already_set_skips_the_delay(scripts: Path) -> None:
    write(scripts, "slow", {"turns": [{"delay_s": 30, "tool_calls": [call("c1")]}]})
    model = ScriptedModel.from_file(scripts / "slow.json")
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    turn = play(model, stop)
    assert time.monotonic() - started < 1.0
    assert turn.final
    assert turn.tool_calls == ()


def test_a_round_cannot_change_the_script_the_next_round_plays(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    call = {"id": "c1", "name": "publish_execution_plan", "arguments": {"nodes": [{"id": "a"}]}}
    (scripts / "leak.json").write_text(json.dumps({"turns": [{"tool_calls": [call]}]}))
    spec = f"scripted:{scripts}"
    first = load_model(spec, "leak").next_turn([], [], threading.Event())
    first.tool_calls[0].arguments["nodes"][0]["id"] = "changed by a tool"
    second = load_model(spec, "leak").next_turn([], [], threading.Event())
    assert second.tool_calls[0].arguments == {"nodes": [{"id": "a"}]}


def test_a_script_rewritten_on_disk_is_read_again(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    path = scripts / "leak.json"
    path.write_text(json.dumps({"turns": [{"content": "one"}]}))
    assert (
        load_model(f"scripted:{scripts}", "leak").next_turn([], [], threading.Event()).content
        == "one"
    )
    path.write_text(json.dumps({"turns": [{"content": "two, longer"}]}))
    again = load_model(f"scripted:{scripts}", "leak").next_turn([], [], threading.Event())
    assert again.content == "two, longer"


def test_a_reference_resolves_after_compaction_left_its_result_out(scripts: Path) -> None:
    # With a small window the history is compacted: the result a later turn refers to may be
    # gone from the messages by then. The round's model remembers what it was sent.
    write(
        scripts,
        "refs",
        {
            "turns": [
                {"tool_calls": [call("q1", "query_data_source")]},
                {"tool_calls": [call("r1", "save_report", evidence_ids=["${q1.evidence_id}"])]},
            ]
        },
    )
    model = ScriptedModel.from_file(scripts / "refs.json")
    result = {"role": "tool", "tool_call_id": "q1", "content": json.dumps({"evidence_id": "e-7"})}
    model.next_turn([{"role": "user", "content": "go"}, result], [], threading.Event())
    compacted = [{"role": "user", "content": "Earlier turns were compacted"}]
    turn = model.next_turn(compacted, [], threading.Event())
    assert turn.tool_calls[0].arguments == {"evidence_ids": ["e-7"]}


def test_a_reused_call_id_refers_to_its_latest_result(scripts: Path) -> None:
    # A script may use one id on several turns (a page at a time): a reference takes what the
    # latest call of that id returned, as the history reads, not what the first one did.
    write(
        scripts,
        "pages",
        {
            "turns": [
                {"tool_calls": [call("p", "query_data_source")]},
                {"tool_calls": [call("p", "query_data_source", cursor="${p.cursor}")]},
                {"tool_calls": [call("p", "query_data_source", cursor="${p.cursor}")]},
            ]
        },
    )
    model = ScriptedModel.from_file(scripts / "pages.json")
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    stop = threading.Event()
    model.next_turn(history, [], stop)
    history.append({"role": "tool", "tool_call_id": "p", "content": json.dumps({"cursor": "a"})})
    assert model.next_turn(history, [], stop).tool_calls[0].arguments == {"cursor": "a"}
    history.append({"role": "tool", "tool_call_id": "p", "content": json.dumps({"cursor": "b"})})
    assert model.next_turn(history, [], stop).tool_calls[0].arguments == {"cursor": "b"}


@pytest.mark.parametrize("spec", [None, ""])
def test_a_model_setting_that_is_not_set_says_so(spec: str | None) -> None:
    # `tasks ask` on a machine without ORCH_MODEL read "unsupported ORCH_MODEL None".
    with pytest.raises(ModelError) as caught:
        load_model(spec, "leak")
    assert str(caught.value).startswith("ORCH_MODEL is not set;")
    assert "None" not in str(caught.value)
