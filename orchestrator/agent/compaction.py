"""The conversation of one round as sent to the model, and its compaction when it grows too big.

A request is: the system prompt, the task brief, the current plan (its own message, re-sent on
every call, so compaction can never remove it), the summary of compacted turns if any, then the
history as *transactions*: an assistant turn together with every tool result it got. Compaction
works on whole transactions only, so an assistant tool call is never separated from its results
(strict servers reject that), and the latest transaction is always kept.

Before each call the request is measured (`budget.TokenCounter`). Above the request limit (85 %
of the window) the oldest transactions are folded into a summary: a summary call to the same
model, or, when that fails, a deterministic digest of the receipts and the plan. A compaction
that cannot reach its target because of the latest transaction carries the summary on with a
digest of what it folds instead of asking the model (the next one would summarise it again).
If what must be kept does not fit on its own, `ContextOverflow` ends the round: nothing is
dropped silently.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from orchestrator.agent.budget import ContextBudget, ContextOverflow, TokenCounter
from orchestrator.agent.digest import (
    MIN_SUMMARY_TOKENS,
    carry_summary,
    digest,
    envelope,
    fit_digest,
)

__all__ = [
    "PLAN_TOOLS",
    "Compaction",
    "Conversation",
    "Summarizer",
    "SummaryAnswer",
    "TranscriptHook",
]

log = logging.getLogger(__name__)

#: Tools whose successful result is the current plan.
PLAN_TOOLS = frozenset({"publish_execution_plan"})

PLAN_PREFIX = "Current execution plan (kept by the host and re-sent on every call):\n"
SUMMARY_PREFIX = "Summary of earlier turns of this round (compacted to fit the context window):\n"

#: Asks a model for a summary of the messages that follow: its text, or the call's answer with
#: its token usage (`SummaryAnswer`), or None.
Summarizer = Callable[[list[dict[str, Any]]], "str | SummaryAnswer | None"]

_SUMMARY_SYSTEM = (
    "Summarise the earlier part of an investigation for the agent that continues it. Keep every "
    "tool call with its status (succeeded, failed, pending, unknown), invocation ids, result "
    "ids, facts found with their sources, and open questions. Writes whose status is unknown "
    "must stay marked unknown. Be brief; write plain text."
)


@dataclass(frozen=True)
class SummaryAnswer:
    """What a summary call answered, and what it cost as the server reported it."""

    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True)
class Compaction:
    """One compaction: what the transcript records."""

    summary: str
    source: Literal["model", "digest"]
    messages_replaced: int
    tokens_before: int
    tokens_after: int
    #: The token usage of the summary call, when one was answered (the execution's usage).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class TranscriptHook(Protocol):
    """Where the round's transcript goes (the durable transcript implements it)."""

    def compacted(self, compaction: Compaction) -> None:
        """Record a compaction (its summary replaces the turns it covers in later requests)."""

    def subagent(self, parent_call_id: str) -> TranscriptHook:
        """The transcript of a sub-agent started by the tool call `parent_call_id`."""


@dataclass
class _Unit:
    """A transaction: one assistant message and the tool messages answering its calls.

    `bound` (UTF-8 bytes) is kept as messages come; the exact token count is taken only when a
    request's bound does not fit, or calibration asks for it. Each message's JSON text is
    kept with it (`texts`): a message is not changed once added (its bound is already summed),
    and a query's result is ~15 KB to serialise again for every count.
    """

    messages: list[dict[str, Any]]
    counter: TokenCounter | None
    bound: int = 0
    _exact: int | None = None
    texts: list[str] = field(default_factory=list)

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if self.counter is not None:
            text = self.counter.message_text(message)
            self.texts.append(text)
            self.bound += self.counter.bound_of_text(text)
        self._exact = None

    @property
    def tokens(self) -> int:
        if self._exact is None:
            counter = self.counter
            self._exact = sum(counter.message_of_text(t) for t in self.texts) if counter else 0
        return self._exact


@dataclass
class Conversation:
    """The messages of one round and the rules that keep them within the budget."""

    system: str
    brief: str
    budget: ContextBudget | None = None
    counter: TokenCounter | None = None
    summarize: Summarizer | None = None
    transcript: TranscriptHook | None = None
    plan: Any = None
    summary: str | None = None
    compactions: list[Compaction] = field(default_factory=list)
    _units: list[_Unit] = field(default_factory=list)
    #: The calls whose result is sensitive: a summary request shows them by status only.
    _sensitive: set[str] = field(default_factory=set)
    #: Arguments a summary request shows instead of the model's, by call id: a sensitive
    #: call's redacted, a command's without its `env` values (as the transcript keeps them).
    _kept_arguments: dict[str, Any] = field(default_factory=dict)
    #: The JSON texts of the messages `prepare` last returned, and its tool definitions.
    _last: tuple[list[str], Sequence[Mapping[str, Any]]] = ([], ())
    #: The tool definitions last measured and their exact size: the same list is sent on
    #: every call of a round, so it is dumped and looked up once, not once per call.
    _tools_measured: tuple[Sequence[Mapping[str, Any]], int] | None = None

    def kept_tokens(self) -> int:
        """What every request keeps, as the server counts it: the system prompt, the brief, the
        current plan and the tool definitions of the last request (what a result shown whole
        must leave room beside)."""
        if self.counter is None:
            return 0
        _, tools = self._last
        head = self.counter.raw(self._head(with_summary=False), ())
        return self.counter.scaled(head + self._tools_tokens(tools))

    def kept_bound(self) -> int:
        """At least `kept_tokens()`, from the kept texts' bytes where they were never counted
        (a token is at least one byte): nothing is tokenized."""
        if self.counter is None:
            return 0
        _, tools = self._last
        head = self.counter.raw_bound(self._head(with_summary=False), ())
        return self.counter.scaled(head + self._tools_tokens(tools))

    @property
    def last_raw(self) -> int:
        """The uncalibrated size of the last request `prepare` returned (for calibration),
        counted when asked: most requests never need their exact size. `counter.raw` of that
        request, from the texts its messages were measured by (a server that reports usage
        asks after every call: the history is not serialised again each time)."""
        if self.counter is None:
            return 0
        texts, tools = self._last
        if not texts:
            return 0
        counter = self.counter
        return (
            counter.raw([], ())  # the request's own framing
            + sum(counter.message_of_text(text) for text in texts)
            + self._tools_tokens(tools)
        )

    # -- history -----------------------------------------------------------------------------

    def add_assistant(self, message: dict[str, Any]) -> None:
        unit = _Unit([], self.counter)
        unit.add(message)
        self._units.append(unit)

    def add_tool_results(
        self,
        messages: Sequence[dict[str, Any]],
        calls: Sequence[tuple[str, Any]] = (),
        sensitive: Collection[str] = (),
        kept_arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Append the results of the latest assistant turn; `calls` pairs each tool name with
        its `ToolResult` so a successful plan publish becomes the current plan; `sensitive`
        names the calls whose result a summary request must not show, and `kept_arguments`
        gives, by call id, the arguments it shows instead of the model's (redacted ones)."""
        self._sensitive.update(sensitive)
        self._kept_arguments.update(kept_arguments or {})
        unit = self._units[-1]
        for message in messages:
            unit.add(message)
        for name, result in calls:
            if name in PLAN_TOOLS and getattr(result, "status", None) == "succeeded":
                # The whole plan, not the preview a large one is shown as in its result.
                unpaged = getattr(result, "unpaged", None)
                self.plan = unpaged if unpaged is not None else getattr(result, "payload", None)

    @property
    def history(self) -> list[dict[str, Any]]:
        return [message for unit in self._units for message in unit.messages]

    # -- requests ----------------------------------------------------------------------------

    def messages(self, notice: str | None = None) -> list[dict[str, Any]]:
        """The request's messages as they stand, without measuring."""
        return [*self._head(), *self.history, *self._tail(notice)]

    def prepare(
        self, tools: Sequence[Mapping[str, Any]], notice: str | None = None
    ) -> list[dict[str, Any]]:
        """The messages of the next call, compacted if needed; `ContextOverflow` when the parts
        that must stay do not fit. `notice` is a one-call message after the history."""
        if self.budget is None or self.counter is None:
            return self.messages(notice)
        counter = self.counter
        limit = self.budget.request_limit
        # The byte bound first: when it fits, the exact count would fit too (it is smaller),
        # so the request goes out as it stands and nothing is tokenized.
        bound = (
            counter.raw_bound([*self._head(), *self._tail(notice)], ())
            + self._tools_tokens(tools)
            + sum(unit.bound for unit in self._units)
        )
        if counter.scaled(bound) <= limit:
            return self._sent(notice, tools)
        fixed = counter.raw([*self._head(with_summary=False), *self._tail(notice)], tools)
        summary = self._summary_tokens()
        history = sum(unit.tokens for unit in self._units)
        before = fixed + summary + history
        if counter.scaled(before) > limit:
            latest = self._units[-1].tokens if self._units else 0
            must = counter.scaled(fixed + latest)
            if must > limit:
                raise ContextOverflow(
                    f"the context window of {self.budget.window} tokens is too small: the system "
                    "prompt, task brief, current plan, tool definitions and the latest tool "
                    f"transaction need about {must} tokens, above the request limit of {limit} "
                    f"(the window less its 15 % margin; {self._sizes(fixed, tools)}); nothing "
                    f"was dropped; {self._advice(tools)}"
                )
            self._compact(fixed, before)
        return self._sent(notice, tools)

    def _sent(self, notice: str | None, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The request's messages, remembered (as the texts they were measured by) for
        `last_raw`."""
        assert self.counter is not None
        head, tail = self._head(), self._tail(notice)
        texts = [self.counter.message_text(message) for message in (*head, *tail)]
        texts.extend(text for unit in self._units for text in unit.texts)
        self._last = (texts, tools)
        return [*head, *self.history, *tail]

    def _advice(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Which settings make room, for the operator who reads the line: the output reserved
        when it narrows the limit, the tool definitions when they take a third of it, and the
        window itself."""
        assert self.budget is not None
        assert self.counter is not None
        budget = self.budget
        advice = []
        if budget.max_output_tokens and budget.request_limit == (
            budget.window - budget.max_output_tokens
        ):
            advice.append(
                f"lower LLM_MAX_OUTPUT_TOKENS (it reserves {budget.max_output_tokens} tokens of "
                "the window for the model's answer)"
            )
        defined = self.counter.scaled(self._tools_tokens(tools))
        if budget.max_tools == 0 and defined * 3 >= budget.request_limit:
            advice.append(
                "set LLM_MAX_TOOLS (e.g. 4: every call is offered the resident tools and 4 "
                "chosen for the task, the agent finds the rest with search_tools)"
            )
        advice.append("run a model with a larger window and raise LLM_CONTEXT_WINDOW")
        return "to make room: " + ", or ".join(advice)

    def _sizes(self, fixed: int, tools: Sequence[Mapping[str, Any]]) -> str:
        """Where the tokens of an overflow are, for the one who must act on it: the fixed
        parts (of them the tool definitions) and the latest transaction's largest message."""
        assert self.counter is not None
        counter = self.counter
        said = (
            f"fixed parts about {counter.scaled(fixed)}, of which tool definitions about "
            f"{counter.scaled(self._tools_tokens(tools))}"
        )
        if not self._units:
            return said
        unit = self._units[-1]
        names = {
            str(call.get("id")): str(call.get("name"))
            for call in unit.messages[0].get("tool_calls") or ()
        }
        largest, where = 0, ""
        for message, text in zip(unit.messages, unit.texts, strict=False):
            tokens = counter.message_of_text(text)
            if tokens <= largest:
                continue
            largest = tokens
            if message.get("role") == "tool":
                call_id = str(message.get("tool_call_id"))
                where = f"the result of {names.get(call_id, 'a call')} {call_id}"
            else:
                where = "the model's own turn (its text, reasoning and calls)"
        calls = len(names)
        # Each result of a turn needs room of its own (`agent.turn_room`): the operator who
        # reads the line learns that the model's calls, not one result, filled it.
        several = (
            f" ({calls} tool calls in one turn, each result with room of its own: a model "
            "that makes fewer calls a turn needs less)"
            if calls > 1
            else ""
        )
        return (
            f"{said}; the latest transaction about {counter.scaled(unit.tokens)}{several}, its "
            f"largest part {where}: about {counter.scaled(largest)}"
        )

    # -- compaction --------------------------------------------------------------------------

    def _compact(self, fixed: int, before: int) -> None:
        assert self.budget is not None
        assert self.counter is not None
        counter = self.counter
        budget = self.budget
        if not self._units:
            return
        reserve = budget.summary_tokens + counter.message({"role": "user", "content": ""})
        kept = [self._units[-1]]
        used = fixed + reserve + kept[0].tokens
        for unit in reversed(self._units[:-1]):
            if counter.scaled(used + unit.tokens) > budget.compact_target:
                break
            kept.insert(0, unit)
            used += unit.tokens
        old = self._units[: len(self._units) - len(kept)]
        old_messages = [message for unit in old for message in unit.messages]
        # Room left for the summary in this request, in uncalibrated tokens.
        kept_tokens = sum(unit.tokens for unit in kept)
        wrapper = counter.message({"role": "user", "content": SUMMARY_PREFIX})
        room = math.floor(budget.request_limit / counter.ratio) - fixed - kept_tokens - wrapper
        allowed = min(budget.summary_tokens, room)
        carried = None
        if len(kept) == 1 and counter.scaled(used) > budget.compact_target and self.summary:
            # The latest transaction alone keeps the request above the target: this compaction
            # only gets it under the limit, and the next turn's folds that transaction too. A
            # summary call now would be summarised again then (before, two model calls every
            # turn while such transactions came): the summary is carried on with a digest line
            # for each call folded now, and the compaction that reaches its target asks.
            carried = carry_summary(self.summary, old_messages, allowed, counter)
        source: Literal["model", "digest"]
        if carried is not None:
            text, source, usage = carried, "digest", None
        else:
            text, source, usage = self._summary_text(old_messages)
            if allowed < MIN_SUMMARY_TOKENS:
                text = "(the earlier turns were compacted; no room is left for their summary)"
            elif source == "digest":
                text = fit_digest(text, allowed, counter)
            else:
                text = counter.truncate(text, allowed)
        self.summary = text
        self._units = kept
        after = fixed + self._summary_tokens() + kept_tokens
        record = Compaction(
            summary=text,
            source=source,
            messages_replaced=len(old_messages),
            tokens_before=counter.scaled(before),
            tokens_after=counter.scaled(after),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
        )
        self.compactions.append(record)
        log.info(
            "compacted %d messages (%s summary): %d -> %d tokens",
            record.messages_replaced,
            source,
            record.tokens_before,
            record.tokens_after,
        )
        if self.transcript is not None:
            self.transcript.compacted(record)

    def _summary_text(
        self, old: list[dict[str, Any]]
    ) -> tuple[str, Literal["model", "digest"], SummaryAnswer | None]:
        answer: SummaryAnswer | None = None
        if self.summarize is not None:
            try:
                given = self.summarize(self._summary_request(old))
            except Exception as exc:  # any failure of the summary call falls back to the digest
                log.warning("summary call failed, using the digest: %s", type(exc).__name__)
                given = None
            answer = given if isinstance(given, SummaryAnswer) else None
            text = answer.text if answer is not None else given
            if isinstance(text, str) and text.strip():
                return text.strip(), "model", answer
        return digest(old, plan=self.plan, previous=self.summary), "digest", answer

    def _summary_request(self, old: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.budget is not None
        assert self.counter is not None
        parts = []
        if self.summary:
            parts.append("Earlier summary:\n" + self.summary)
        # The summary's answer is recorded as it comes (the transcript): a sensitive result,
        # whose body the transcript never keeps, is shown to the summary call by status only.
        parts.extend(_render(message, self._sensitive, self._kept_arguments) for message in old)
        if self.plan is not None:
            parts.append("Current plan:\n" + _dump(self.plan))
        text = "\n".join(parts)
        # The summary request itself must fit: keep its beginning and its end.
        room = max(
            MIN_SUMMARY_TOKENS,
            math.floor(self.budget.request_limit / self.counter.ratio)
            - self.budget.summary_tokens
            - self.counter.text(_SUMMARY_SYSTEM)
            - 32,
        )
        if self.counter.text(text) > room:
            head = self.counter.truncate(text, room // 2)
            tail_chars = text[len(head) :]
            tail = self.counter.truncate(tail_chars[::-1], room // 2)[::-1]
            text = head + "\n[…]\n" + tail
        return [
            {"role": "system", "content": _SUMMARY_SYSTEM},
            {"role": "user", "content": text},
        ]

    # -- parts -------------------------------------------------------------------------------

    def _head(self, *, with_summary: bool = True) -> list[dict[str, Any]]:
        head: list[dict[str, Any]] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.brief},
        ]
        if self.plan is not None:
            head.append({"role": "user", "content": PLAN_PREFIX + _dump(self.plan)})
        if with_summary and self.summary is not None:
            head.append({"role": "user", "content": SUMMARY_PREFIX + self.summary})
        return head

    @staticmethod
    def _tail(notice: str | None) -> list[dict[str, Any]]:
        return [] if notice is None else [{"role": "user", "content": notice}]

    def _tools_tokens(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """The exact tokens of `tools`, remembered while the same definitions come back (the
        memo keeps them referenced, so an identity match is the same objects)."""
        assert self.counter is not None
        memo = self._tools_measured
        if (
            memo is not None
            and len(memo[0]) == len(tools)
            and all(a is b for a, b in zip(memo[0], tools, strict=True))
        ):
            return memo[1]
        tokens = sum(self.counter.schema(tool) for tool in tools)
        self._tools_measured = (list(tools), tokens)
        return tokens

    def _summary_tokens(self) -> int:
        if self.summary is None or self.counter is None:
            return 0
        return self.counter.message({"role": "user", "content": SUMMARY_PREFIX + self.summary})


def _render(
    message: Mapping[str, Any],
    sensitive: Collection[str] = (),
    kept_arguments: Mapping[str, Any] | None = None,
) -> str:
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id in sensitive:
            body = envelope(message)
            status = body.get("status", "unknown") if body is not None else "not readable"
            return (
                f"[tool result {call_id}] (a sensitive result: status {status}; its body is "
                "not shown)"
            )
        return f"[tool result {call_id}] {message.get('content')}"
    calls = message.get("tool_calls") or ()
    text = f"[{role}] {message.get('content') or ''}"
    kept = kept_arguments or {}
    for call in calls:
        arguments = kept.get(call.get("id"), call.get("arguments"))
        text += f"\n  calls {call.get('name')} [{call.get('id')}] {_dump(arguments)}"
    return text


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
