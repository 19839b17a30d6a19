"""The deterministic digest of compacted turns: what a compaction keeps when no model summary
is had (the scripted model, or a summary call that failed), one line per tool call with its
receipt and status, the assistant's notes and the plan's node statuses.

A digest is one entry a line, so that `fit_digest` can leave out the oldest entries (writes whose
outcome is `unknown` or `pending` last) and count them on a line of their own, and a later
digest carries an earlier one's entries on under a single header. Argument values are never in
it: they may be sensitive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.agent.budget import TokenCounter

__all__ = ["MIN_SUMMARY_TOKENS", "carry_summary", "digest", "envelope", "fit_digest"]

#: The least room worth giving a summary; below it a compaction says that none fits.
MIN_SUMMARY_TOKENS = 16

_MESSAGE_NOTE_CHARS = 200
_DIGEST_HEADER = "Earlier turns were compacted (a digest of the tool receipts and the plan)."
_PLAN_LINE = "Plan nodes: "
_LEFT_OUT = re.compile(r"\((\d+) earlier entries left out to fit\)")
#: A digest entry of a call whose outcome is not known yet: the last to leave a full digest.
_UNSETTLED = re.compile(r"\] → (unknown|pending)\b")


def digest(
    messages: Sequence[Mapping[str, Any]], *, plan: Any = None, previous: str | None = None
) -> str:
    """A deterministic summary of compacted turns: every call with its receipt and status,
    the assistant's notes, and the plan's node statuses. Argument values are left out (they
    may be sensitive); a `call_api` call names its operation. One entry a line, so that
    `fit_digest` can leave out the oldest; a previous digest's entries are carried on under
    this one's header (a header per compaction would crowd the receipts out)."""
    lines = [_DIGEST_HEADER]
    if previous:
        left_out, entries, _plan = _digest_parts(previous)
        if left_out:
            lines.append(_left_out(left_out))
        lines.extend(entries)
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                lines.append("- assistant: " + _short(content))
            for call in message.get("tool_calls") or ():
                names[str(call.get("id"))] = _call_label(call)
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            lines.append(f"- {names.get(call_id, 'call')} [{call_id}] → {_result_label(message)}")
    nodes = plan.get("nodes") if isinstance(plan, Mapping) else None
    if isinstance(nodes, list):
        statuses = ", ".join(
            f"{node.get('id')}={node.get('status')}" for node in nodes if isinstance(node, Mapping)
        )
        lines.append(_PLAN_LINE + statuses)
    return "\n".join(lines)


def fit_digest(text: str, tokens: int, counter: TokenCounter) -> str:
    """`text`, a digest, within `tokens`: the header, the plan's statuses and the newest entries,
    writes whose outcome is `unknown` or `pending` kept before any other entry, with a line that
    counts what was left out. Cut from the end instead, a growing digest lost its newest
    receipts and kept the oldest."""
    if counter.text(text) <= tokens:
        return text
    left_out, entries, plan = _digest_parts(text)
    fixed = [_DIGEST_HEADER, _left_out(left_out + len(entries)), *([plan] if plan else [])]
    room = tokens - counter.text("\n".join(fixed)) - 1
    ranked = sorted(
        range(len(entries)),
        key=lambda index: (not _UNSETTLED.search(entries[index]), -index),
    )
    kept: set[int] = set()
    for index in ranked:
        cost = counter.text(entries[index]) + 1  # and its line break
        if cost <= room:
            kept.add(index)
            room -= cost
    lines = [_DIGEST_HEADER]
    if left_out + len(entries) - len(kept):
        lines.append(_left_out(left_out + len(entries) - len(kept)))
    lines.extend(entry for index, entry in enumerate(entries) if index in kept)
    if plan:
        lines.append(plan)
    return counter.truncate("\n".join(lines), tokens)


def carry_summary(
    summary: str, messages: Sequence[Mapping[str, Any]], tokens: int, counter: TokenCounter
) -> str | None:
    """`summary` with a digest line for each call of `messages` after it, within `tokens`: the
    summary's end gives way to the lines; None when the lines alone do not fit."""
    lines = "\n".join(digest(messages).split("\n")[1:])  # the entries, not the header
    if not lines:
        return summary if counter.text(summary) <= tokens else counter.truncate(summary, tokens)
    left = tokens - counter.text(lines) - 1
    if left < MIN_SUMMARY_TOKENS:
        return None
    return counter.truncate(summary, left).rstrip() + "\n" + lines


def _digest_parts(text: str) -> tuple[int, list[str], str | None]:
    """A digest's count of entries left out, its entries and its plan line; any other text (a
    model's summary before the digest) is one entry, "Before that: ..."."""
    lines = text.split("\n")
    if lines[0] != _DIGEST_HEADER:
        return 0, ["Before that: " + " ".join(text.split())], None
    left_out, entries, plan = 0, [], None
    for line in lines[1:]:
        counted = _LEFT_OUT.fullmatch(line)
        if counted:
            left_out += int(counted.group(1))
        elif line.startswith(_PLAN_LINE):
            plan = line
        elif line:
            entries.append(line)
    return left_out, entries, plan


def _left_out(count: int) -> str:
    return f"({count} earlier entries left out to fit)"


def _call_label(call: Mapping[str, Any]) -> str:
    name = str(call.get("name"))
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    if isinstance(arguments, Mapping) and isinstance(arguments.get("operation_id"), str):
        return f"{name}({arguments['operation_id']})"
    return name


def envelope(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A tool message's envelope (status, code, receipt, message, result), if readable."""
    try:
        body = json.loads(str(message.get("content")))
    except ValueError:
        return None
    return body if isinstance(body, Mapping) else None


def _result_label(message: Mapping[str, Any]) -> str:
    body = envelope(message)
    if body is None:
        return "result not readable"
    label = str(body.get("status", "unknown"))
    for key in ("code", "invocation_id"):
        if body.get(key):
            label += f" {key}={body[key]}"
    if body.get("message"):
        label += ": " + _short(str(body["message"]))
    return label


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_NOTE_CHARS else text[: _MESSAGE_NOTE_CHARS - 1] + "…"
