"""The room each result of a running turn has in the next request of a small context window.

Every result of a turn is shown in the next request beside the kept parts (prompt, brief, plan,
tool definitions) and the turn's other results. The request builder (`agent.request`) keeps one
`ResultRoom` per round and hands its figures to the tools and the host through
`ToolContext.extras`: how much of a large result's preview or page (`RESULT_FIT`,
`PREVIEW_FIT`) and of a result shown whole (`WHOLE_FIT`) one answer may show, how many of a
turn's reads the next request holds (`TURN_FIT`, `agent.turn_room`), and the answers of the
turn's calls known before the others fit theirs (`TURN_ANSWERED`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.agent.budget import TokenCounter
from orchestrator.agent.compaction import Conversation
from orchestrator.agent.evidence import CITATION_CHARS
from orchestrator.agent.receipted import answer_texts
from orchestrator.agent.sensitive import MASKED_NOTE, noted
from orchestrator.agent.text import clean_text
from orchestrator.agent.turn_room import Planned, TurnFit, in_fit_order, no_room
from orchestrator.tools.base import Tool, ToolResult
from orchestrator.tools.results import NO_PREVIEW_NOTE, PAGE_NOTE

if TYPE_CHECKING:
    from orchestrator.agent.request import AgentContext

__all__ = ["BYTES_PER_TOKEN", "ResultRoom"]

#: The bytes of a token by which the share of a result shown whole is estimated
#: (`ResultRoom.whole_fit`) when it surely fits what the request leaves: JSON rows of readings
#: run about 2.4 bytes a token, prose about 4. Denser text (digits, punctuation) may take more
#: than its share, never more than the request leaves.
BYTES_PER_TOKEN = 3

#: A tool message's content around a result shown whole with the host's record, but for the
#: result and the record's values (`ToolResult.to_message`; `null` stands for the result).
_AROUND = json.dumps(
    {"status": "succeeded", "evidence_id": "", "queried_at": "", "content_ref": "", "result": None}
)

#: The same for a tool that records no evidence (`Tool.records_evidence`): no record beside it.
_BARE = json.dumps({"status": "succeeded", "result": None})

#: A preview's keys around its text (`ToolHost._page`), but for the text and its result id
#: (`ResultCache.put`: 32 hexadecimal characters).
_PREVIEW_AROUND = json.dumps(
    {
        "truncated": True,
        "preview": "",
        "total_chars": 10**6,
        "result_id": "",
        "next_offset": 10**6,
        "note": max(PAGE_NOTE, NO_PREVIEW_NOTE, key=len),
    }
)
_RESULT_ID_CHARS = 32
#: A receipt's invocation id (`store.receipts`: a uuid4 as text), counted a token a character.
_INVOCATION_ID_CHARS = 36

#: The least a preview shows (`ResultRoom.preview_fit`), in tokens (about 150 characters
#: of JSON): fewer (`{`, `{"task_id"`) tell the model nothing; a turn reserves this much for
#: each pageable read that runs (`_least`), and a preview that would show fewer shows none.
_LEAST_PREVIEW = 48

#: The least room a result is given (`ResultRoom._room`), in tokens: a window that leaves
#: less fails the next request, saying which settings make room.
_LEAST_ROOM = 64


class ResultRoom:
    """The room of the running turn's results (one per round or sub-agent loop)."""

    def __init__(
        self, context: AgentContext, tools: Mapping[str, Tool] | None, conversation: Conversation
    ) -> None:
        self.context = context
        self.tools = tools
        self.conversation = conversation
        #: The latest assistant message: the turn whose calls are running (`whole_fit`).
        self._calling: dict[str, Any] | None = None
        #: `_room` of the running turn, bounded (False) and exact (True), once computed.
        self._rooms: dict[bool, int] = {}
        #: The running turn's calls left for a later turn (`turn_fit`): their answers' messages.
        self._left: dict[str, dict[str, Any]] = {}
        #: The running turn's calls whose answers are known before the others fit theirs (a
        #: refusal, a look-up that ran first: `answered`), their messages.
        self._known: dict[str, dict[str, Any]] = {}
        #: The running turn's calls as the host is about to answer them (`turn_fit`), by id.
        self._planned: dict[str, Planned] = {}
        #: `_content` once written, by (receipted, cited, masked).
        self._contents: dict[tuple[bool, bool, bool], str] = {}

    def start(self, message: dict[str, Any]) -> None:
        """A new turn: `message` is the assistant message whose calls are about to run."""
        self._calling = message
        self._rooms = {}
        self._left = {}
        self._known = {}
        self._planned = {}

    def whole_fit(self, text: str) -> int:
        """`WHOLE_FIT`: a result shown whole takes at most `ContextBudget.whole_result_tokens`,
        and at most its share of what the kept parts of the request (prompt, brief, plan, tool
        definitions) leave of its limit beside the turn that called it (`_room`; the answer's
        own tokens are reserved in the limit already): in a small window with many tools a
        quarter would not fit beside them."""
        budget, counter = self.context.budget, self.context.counter
        # Tokenizing a day of readings (16 KB) costs about 2 ms of pure Python, more than the
        # rest of a minimal round's agent loop. What the request leaves is a hard limit, so it
        # is measured exactly unless the text's bytes (never fewer than its tokens) fit it;
        # the quarter of the window is a share, estimated at `BYTES_PER_TOKEN` when the text
        # surely fits the room, and measured only when that estimate says it may not.
        size = counter.shown_bytes(text)
        for exact in (False, True):
            room = self._room(exact=exact)
            tokens = min(budget.whole_result_tokens, room)
            surely_fits_room = size <= math.floor(room / counter.ratio)
            if surely_fits_room and size / BYTES_PER_TOKEN <= tokens / counter.ratio:
                return len(text)
        return counter.fit_chars(text, math.floor(tokens / counter.ratio))

    def result_fit(self, text: str) -> int:
        """`RESULT_FIT`: a large result's preview, or a page of it, takes at most
        `ContextBudget.result_tokens`, and at most its share of the room the turn leaves
        (`_room`): two previews in one turn of a small window overflowed it together. Measured
        as it is shown, a string inside the result's JSON: measured as the JSON string alone,
        a preview of quoted text took a third more than its share."""
        budget, counter = self.context.budget, self.context.counter
        # A preview's own keys beside it (`ToolHost._page`), its random result id counted at a
        # token a character: the turn's reserve (`_turn_tokens`) is a result's, not a preview's.
        around = counter.scaled(counter.text(_PREVIEW_AROUND) + _RESULT_ID_CHARS)
        for exact in (False, True):
            tokens = min(budget.result_tokens, self._room(exact=exact) - around)
            shown = counter.fit_chars(text, math.floor(tokens / counter.ratio), nested=True)
            if shown == len(text):
                break
        return shown

    def preview_fit(self, text: str, total: int) -> int:
        """`PREVIEW_FIT`: the preview of a result of `total` characters that `text` starts,
        as `result_fit`, but none when it would show fewer than `_LEAST_PREVIEW` tokens (`{`
        was all a preview of six in a turn showed), and the whole of a result that takes no
        more than its preview's answer would (the preview's keys around it, and the text they
        hold): it costs no more room."""
        budget, counter = self.context.budget, self.context.counter
        around = counter.scaled(counter.text(_PREVIEW_AROUND) + _RESULT_ID_CHARS)
        shown = self.result_fit(text)
        if shown == len(text):
            return shown
        tokens = max(0, min(budget.result_tokens, self._room() - around))
        # As a JSON string (its quotes escaped): never less than the payload's own JSON.
        most = math.floor((tokens + around) / counter.ratio)
        if len(text) == total and counter.fit_chars(text, most) == len(text):
            return len(text)
        return shown if tokens >= counter.scaled(_LEAST_PREVIEW) else 0

    def _room(self, *, exact: bool = True) -> int:
        """What one result of the running turn may take, as the server counts: what the kept
        parts of the request (prompt, brief, plan, tool definitions) and the turn's own
        messages (`_turn_tokens`: the answers known already, a refusal's, a look-up's that ran
        first, a no_room's, as they are shown) leave of its limit, shared equally by the
        turn's calls whose answers are not known yet; never under 64 (a window that leaves
        less fails the next request, saying why).
        `exact=False`: a bound never above it, from the texts' bytes, nothing tokenized (most
        results fit it: the exact count of a prompt, a brief and a plan costs more than the
        rest of a short round's requests). Each figure once per turn, and again once more
        answers are known (`answered`: the look-ups run before the others): every result with
        a payload is fitted (the turn's calls may compute it at once, in two threads)."""
        known = self._rooms.get(exact)
        if known is not None:
            return known
        budget, counter = self.context.budget, self.context.counter
        if exact:
            used = self.conversation.kept_tokens() + counter.scaled(self._turn_tokens())
        else:
            used = self.conversation.kept_bound() + counter.scaled(self._turn_tokens(bound=True))
        shared = len(self._calls()) - len(self._left.keys() | self._known.keys())
        room = max(_LEAST_ROOM, (budget.request_limit - used) // max(1, shared))
        self._rooms[exact] = room
        return room

    def turn_fit(self, planned: Sequence[Planned]) -> TurnFit | None:
        """`TURN_FIT`: how many of the running turn's reads the next request holds at their
        smallest (`turn_room`), beside its writes and its calls answered already; None when
        all of them fit (or when the writes alone do not, or the first read does not fit beside
        the others' answers nor in a turn of its own: every call then runs, as before; when it
        fits a turn of its own, every read waits). The rest are answered `no_room` (the first
        in full and the others in fewer words when the window has no room for each in full),
        and their share of the room goes to the calls that run."""
        self._planned = {plan.call_id: plan for plan in planned}
        self._rooms = {}
        for plan in planned:
            if plan.kind == "answered" and plan.answer is not None:
                self.answered(plan.call_id, plan.answer)
        reads = _in_fit_order([plan for plan in planned if plan.kind == "read"])
        if self._calling is None or len(planned) < 2 or not reads:
            return None
        budget, counter = self.context.budget, self.context.counter
        # Calls the host was not handed (unreadable arguments, answered in the loop) count as
        # a result's envelope, as in `_turn_tokens`.
        unhanded = max(0, len(self._calls()) - len(planned)) * self._least(None, "")
        free = budget.request_limit - self.conversation.kept_tokens()
        fixed = counter.message(self._calling) + unhanded
        for plan in planned:
            if plan.answer is not None and plan.kind == "answered":
                fixed += counter.message(_answer_message(plan.call_id, plan.answer))
            elif plan.kind == "write":
                fixed += self._least(plan, plan.call_id)
        needs = [self._least(plan, plan.call_id) for plan in reads]
        if counter.scaled(fixed + sum(needs)) <= free:
            return None
        # With a write beside them every read may wait; else the first one runs, or waits
        # with the others when it fits a turn of its own but not beside their answers.
        writes = any(plan.kind == "write" for plan in planned)
        least_runs = 0 if writes or self._fits_alone(reads[0], needs[0], free) else 1
        for runs in range(len(reads) - 1, least_runs - 1, -1):
            left = reads[runs:]
            calls, held = len(planned), len(planned) - len(left)
            # Each told in full; else the first in full and the others in fewer words.
            for short in (False, True):
                answers = tuple(
                    no_room(calls, held, budget.window, ran=plan.look_up, short=short and n > 0)
                    for n, plan in enumerate(left)
                )
                messages = {
                    plan.call_id: _answer_message(plan.call_id, answer)
                    for plan, answer in zip(left, answers, strict=True)
                }
                tokens = sum(counter.message(message) for message in messages.values())
                if counter.scaled(fixed + sum(needs[:runs]) + tokens) <= free:
                    self._left = messages
                    self._rooms = {}
                    # A look-up left runs all the same, shown if no larger (`turn_room`).
                    shown = partial(_no_larger, counter) if any(p.look_up for p in left) else None
                    return TurnFit(runs, answers, shown)
        return None

    def _fits_alone(self, plan: Planned, need: int, free: int) -> bool:
        """Whether the read `plan`, at its least (`need`), fits the request in a turn of its own
        (the running turn's message with its call alone), so that a later turn holds it."""
        counter = self.context.counter
        calls = [
            call
            for call in self._calls()
            if isinstance(call, Mapping) and str(call.get("id")) == plan.call_id
        ]
        alone = {**(self._calling or {}), "tool_calls": calls[:1]}
        return counter.scaled(counter.message(alone) + need) <= free

    def answered(self, call_id: str, result: ToolResult) -> None:
        """`TURN_ANSWERED`: the running turn's call `call_id` is answered `result` (refused, or
        run before the others: a look-up): its answer takes the room it takes, and the rest of
        its share goes to the calls whose results are fitted after (`_room`)."""
        content = clean_text(result.message_text)
        self._known[call_id] = {"role": "tool", "tool_call_id": call_id, "content": content}
        self._rooms = {}

    def _least(self, plan: Planned | None, call_id: str) -> int:
        """The uncalibrated tokens of a result's answer at its smallest: the tool message and
        the host's record around it when its tool records one (`_turn_tokens`), and its payload
        at its least (the tool's own, or a preview's keys and least text, `_LEAST_PREVIEW`; at
        least `_LEAST_ROOM`)."""
        counter = self.context.counter
        tokens = self._around(counter.message, call_id, plan or Planned(call_id, "read"))
        if plan is None:
            return tokens
        least = _LEAST_ROOM
        if plan.least is not None:
            # As it is shown: a JSON text inside the tool message's (its quotes escaped).
            least = max(least, counter.text(json.dumps(plan.least, ensure_ascii=False)))
        elif plan.pageable:
            least = max(least, counter.text(_PREVIEW_AROUND) + _RESULT_ID_CHARS + _LEAST_PREVIEW)
        return tokens + least

    def _calls(self) -> list[Any]:
        """The tool calls of the latest assistant message (none before the first)."""
        calls = (self._calling or {}).get("tool_calls")
        return calls if isinstance(calls, list) else []

    def _turn_tokens(self, *, bound: bool = False) -> int:
        """The uncalibrated tokens of the turn whose results are being fitted, but for the
        results themselves: its assistant message, exactly, and for each call the tool message
        around a result and the host's record (of a tool that records one), the record's values
        bounded by their characters
        (`CITATION_CHARS`: their tokens vary with their random digits). `bound`: at least
        that, from the messages' bytes."""
        counter = self.context.counter
        if self._calling is None:
            return 0
        measure = counter.message_bound if bound else counter.message
        tokens = measure(self._calling)
        for call in self._calls():
            call_id = call.get("id") if isinstance(call, Mapping) else None
            answer = self._known.get(str(call_id)) or self._left.get(str(call_id))
            if answer is not None:
                # Answered already, or left for a later turn (`turn_fit`): as it is shown.
                tokens += measure(answer)
                continue
            plan = self._planned.get(str(call_id)) or self._guessed(call)
            tokens += self._around(measure, str(call_id), plan)
        return tokens

    def _around(self, measure: Callable[[dict[str, Any]], int], call_id: str, plan: Planned) -> int:
        """A result's tool message but for the result (`_content`): with the host's record (its
        keys, and its values bounded by their characters) when `plan.cited`, and a write's
        code, message and receipt id."""
        content = self._content(plan)
        around = measure({"role": "tool", "tool_call_id": call_id, "content": content})
        if plan.cited:
            around += CITATION_CHARS
        return around + _INVOCATION_ID_CHARS if plan.receipted else around

    def _guessed(self, call: Any) -> Planned:
        """`call` (as the model sent it) when the host did not say what it is (`turn_fit`):
        its answer may carry the host's record unless its tool is known to record none
        (`Tool.records_evidence`), and a receipt's id and message unless its tool is known
        to be a read or a store write (a plan, a report)."""
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        tool = (self.tools or {}).get(name) if isinstance(name, str) else None
        cited = tool is None or tool.records_evidence()
        kind: Literal["read", "write"] = "read" if tool and tool.effect == "read" else "write"
        receipted = tool is None or tool.effect == "write"
        call_id = str(call.get("id") if isinstance(call, Mapping) else "")
        return Planned(call_id, kind, cited=cited, receipted=receipted)

    def _content(self, plan: Planned) -> str:
        """The content of `plan`'s tool message but for its result (`null`) and the values of
        the host's record (`_around`): a receipt-backed write's with a code, the host's message
        at its longest (and the note of a masked secret, `Planned.masked`) and its receipt's id
        (its characters are added, a token each)."""
        key = (plan.receipted, plan.cited, plan.masked)
        known = self._contents.get(key)
        if known is not None:
            return known
        content = _AROUND if plan.cited else _BARE
        if plan.receipted:
            measure = self.context.counter.text
            name = max([*(self.tools or {}), "x" * 64], key=len)
            # An id inside a message (an unresolved earlier write's) at its longest: a token a
            # character (`~|` is two).
            messages, codes = answer_texts("~|" * (_INVOCATION_ID_CHARS // 2), name)
            message = max(messages, key=measure)
            if plan.masked:
                message = noted(message, MASKED_NOTE)
            shown = json.loads(content)
            written = {"code": max(codes, key=measure), "message": message, "invocation_id": ""}
            content = json.dumps({"status": shown.pop("status"), **written, **shown})
        self._contents[key] = content
        return content


def _in_fit_order(reads: list[Planned]) -> list[Planned]:
    """A turn's reads in the order the window holds them (`turn_room.in_fit_order`)."""
    return in_fit_order(reads, lambda plan: plan.look_up)


def _no_larger(counter: TokenCounter, than: ToolResult, result: ToolResult) -> bool:
    """Whether `result`'s answer takes no more tokens than `than`'s (`TurnFit.shown`)."""
    return counter.text(clean_text(result.message_text)) <= counter.text(than.message_text)


def _answer_message(call_id: str, answer: ToolResult) -> dict[str, Any]:
    """The tool message a call answered without running is shown as (`loop.run_round`)."""
    return {"role": "tool", "tool_call_id": call_id, "content": answer.message_text}
