"""`orchestrator tasks transcript ID`: a task's model turns, tool calls and results as recorded,
a line each, and the tokens they used; with `--json` as the API sends them. An entry an older
version wrote in another shape is printed as written, marked `(unreadable)`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from orchestrator.cli.common import (
    add_json_flag,
    bounded_int,
    command_runtime,
    print_json,
    printable,
)
from orchestrator.domain.recovery import readable_call

__all__ = ["register", "render_transcript"]


def register(actions: Any) -> None:
    """Add `transcript` to the `tasks` sub-commands."""
    transcript = actions.add_parser(
        "transcript", help="the model turns and tool results of a task, as recorded"
    )
    transcript.add_argument("task_id")
    transcript.add_argument(
        "--generation", type=bounded_int(1, 2**31 - 1), help="only this generation"
    )
    add_json_flag(transcript)
    transcript.set_defaults(handler=_transcript)


def _transcript(args: argparse.Namespace) -> int:
    rt = command_runtime()
    try:
        view = rt.tasks.transcript(args.task_id, args.generation)
    finally:
        rt.close()
    from orchestrator.api.models import body_as_sent

    for entry in view["items"]:  # as the API sends it: a body not an object is its JSON text
        entry["body"] = body_as_sent(entry["body"])
    if args.json:
        print_json(view)
    else:
        print(render_transcript(view))
    return 0


def render_transcript(view: dict[str, Any]) -> str:
    """The transcript as a readable page: one line per model turn, call and result. An entry an
    older version wrote in another shape (a body that is not an object, a call without its id or
    name, a key missing) is printed as written, marked `(unreadable)`."""
    lines = [f"transcript of task {view['task_id']}"]
    shown: int | None = None
    for entry in view["items"]:
        if entry["generation"] != shown:
            shown = entry["generation"]
            lines.append(f"generation {shown}:")
        prefix = f"  [{entry['turn']:>2}]" + (
            f" (sub-agent of {entry['parent_call_id']})" if entry.get("parent_call_id") else ""
        )
        lines.extend(_entry_lines(entry, prefix))
    if shown is None:
        lines.append("  (no model turn recorded)")
    total = view["token_usage"]["total"]
    lines.append(
        f"tokens: {total['prompt_tokens']} prompt + {total['completion_tokens']} completion "
        f"in {total['calls']} calls"
    )
    return "\n".join(lines)


def _entry_lines(entry: dict[str, Any], prefix: str) -> list[str]:
    body = entry["body"]
    unreadable = "" if isinstance(body, dict) else f" (unreadable) {printable(_short(body))}"
    body = body if isinstance(body, dict) else {}
    if entry["kind"] == "tool_result":
        detail = body.get("message") or _short(body.get("result"))
        return [
            f"{prefix}   <- {entry.get('call_id')} {entry.get('tool_name')}: "
            f"{entry.get('status')}{unreadable}"
            + (f" ({body['invocation_id']})" if body.get("invocation_id") else "")
            + (f" {detail}" if detail else "")
        ]
    usage = entry.get("usage")
    tokens = f"  [{usage['prompt_tokens']}+{usage['completion_tokens']} tokens]" if usage else ""
    if entry["kind"] == "summary":
        return [f"{prefix} summary:{unreadable or ' ' + _short(body.get('summary'))}{tokens}"]
    if unreadable:
        return [f"{prefix} model:{unreadable}{tokens}"]
    lines = []
    if body.get("reasoning_content"):
        # A reasoning model's thinking, recorded with the turn: why it called what it did.
        lines.append(f"{prefix} thinking: {_short(body['reasoning_content'])}")
    if body.get("content"):
        lines.append(f"{prefix} model: {_short(body['content'])}{tokens}")
        tokens = ""
    malformed = body.get("malformed")
    malformed = malformed if isinstance(malformed, dict) else {}
    calls = body.get("tool_calls") or []
    for call in calls if isinstance(calls, list) else [calls]:
        if not readable_call(call):
            text = call if isinstance(call, str) else _short(call)
            lines.append(f"{prefix}   -> (unreadable) {printable(text)}")
            continue
        sent = _short(call.get("arguments"))
        if "raw_arguments" in call:
            # Unreadable arguments: what the model sent, not the `{}` the history carries.
            sent = f"raw {_short(call['raw_arguments'])}"
        markers = call.get("arguments_markers")
        if isinstance(markers, dict) and markers:
            # Leaked gpt-oss markers the host cut to read the arguments (`argument_markers`).
            around = f"{markers.get('before', '')}…{markers.get('after', '')}"
            sent = f"{sent} (sent as {printable(_short(around))})"
        name = call["name"]
        if call.get("sent_name"):
            # A leaked gpt-oss name the host resolved (`agent.tool_names`): what ran, as sent.
            name = f"{name} (sent as {printable(_short(call['sent_name']))!r})"
        lines.append(f"{prefix}   -> {call['id']} {name} {sent}")
        if call["id"] in malformed:
            lines.append(f"{prefix}      (not run: {_short(malformed[call['id']])})")
    if not body.get("content") and not body.get("tool_calls"):
        lines.append(f"{prefix} model: (no answer){tokens}")
    elif tokens and lines:
        lines[-1] += tokens
    if body.get("cut_off"):
        lines.append(f"{prefix}   (cut off: {_short(body['cut_off'])})")
    return lines


def _short(value: Any, limit: int = 160) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
