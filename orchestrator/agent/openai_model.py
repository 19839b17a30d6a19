"""`ORCH_MODEL=openai:<model>`: any OpenAI-compatible chat-completions server with tools.

Built on the official `openai` package with its own retries off (`max_retries=0`): the statuses
the openai client itself retries (408, 409, 429, 5xx, or what `x-should-retry` says), connection
errors and a 200 whose body is not a completion are retried here (`orchestrator.agent.retries`),
within `LLM_MAX_RETRIES` and never past the point the lease keeper vouches for the round; any
other 4xx is not retried, except one refusing an optional parameter, which is left out
(`server_params`). A completion without `choices` is retried like an unreadable one. When
the budget is spent the round ends `model_error` with the reason. The API key is a `SecretStr`
and never appears in a log line or an error message.

LLM_TIMEOUT_SECONDS bounds a whole call, from the send to the answer's last byte, not each read
as httpx would (a server dribbling its answer held a round `running` for ever): the round stops
waiting at the timeout and retries it as a timeout, and the abandoned request is given up and its
connection closed by `model_http`, which also refuses an answer past `MAX_MODEL_ANSWER_BYTES`
(decoded) without holding it; that is retried like an unreadable answer.

Tool-call arguments that are not a JSON object come back in `ModelTurn.malformed`, so the loop
answers them `failed` and the model can correct itself; the round goes on (arguments a gpt-oss
server left its harmony markers around are read without them, by an exact rule:
`argument_markers`). So do calls whose
id repeats one of the same turn (under an id of their own: the history must name each call once);
a missing id, or one longer than `MAX_CALL_ID_CHARS`, is replaced by one of the host's. A server
that numbers its ids per turn (`"0"` or `call_0` in every reply: every turn's ids count from 0
or 1 and start as the first turn's did) has its ids scoped to the round and the turn
(`call_0~3fa2c1t3`), the first turn's too, since its id names a call within one reply only (and
the next generation of the task, in the same session, counts from 0 again); once a turn came
with an id that does not
count (`call_a1`) or a fresh first id, the server's ids are its own per call, and an earlier
turn's id coming again is the model's, left for the host to refuse (other arguments) or
deduplicate (the same).

A tool name a gpt-oss server leaked harmony into (`functions.save_report`,
`save_report<|channel|>commentary`, `save_reportjson`) is put back to the offered tool it names
by an exact rule (`tool_names`), the name as sent kept beside it for the transcript.

A call in the legacy shape (`message.function_call`) runs as one call under an id of the
host's, and an event stream the request did not ask for is read as the reply it holds
(`streamed`). The host's ids are unique to the round: a task's generations share one session.

The calls' threads and the shared clients are `model_calls`'s; reading a reply's pieces
(arguments, content parts, legacy calls, counting ids) is `reply_parts`'s; the wording of a
server's refusal, with the setting to change, is `model_errors`'s.

A reply the server cut short (`finish_reason` `length` or `content_filter`) says so in
`ModelTurn.cut_off`: its last call, if unreadable, is answered `failed` naming the limit (the
cut is at the reply's end; an earlier unreadable call is the model's own mistake), and without
tool calls it is no final answer (the loop ends the round `model_error`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import httpx2
import openai
from openai.types.chat import ChatCompletion

from orchestrator.agent.argument_markers import read_arguments
from orchestrator.agent.model import Model, ModelBusy, ModelError, ModelTurn, TokenUsage
from orchestrator.agent.model_calls import client_for, close_clients, submit, wait
from orchestrator.agent.model_errors import (
    base_path_hint,
    described,
    error_of,
    error_status,
    redacted,
    refusal_hint,
    tools_refused,
    wrong_endpoint,
)
from orchestrator.agent.model_http import MAX_MODEL_ANSWER_BYTES, AnswerTooLarge, CorruptAnswer
from orchestrator.agent.reply_parts import (
    as_calls,
    called_in_thinking,
    counters,
    id_text,
    legacy_call,
    parts_text,
    raw_text,
    shape_problem,
    short_id,
    token_count,
)
from orchestrator.agent.retries import RetryBudget, parse_retry_after, should_retry
from orchestrator.agent.server_params import adapt, refused_parameter
from orchestrator.agent.streamed import StreamError, assembled, is_event_stream
from orchestrator.agent.text import clean_text
from orchestrator.agent.tool_names import named
from orchestrator.agent.wire import HistoryError, check_history, to_wire_messages, to_wire_tools
from orchestrator.settings import Settings
from orchestrator.tools.base import ToolCall

__all__ = ["OpenAIModel", "client_for", "close_clients"]

#: A 200 whose body is not a completion (retried like a 5xx: a proxy or a load balancer hiccup).
_UNREADABLE = "the model server's answer is not readable as a chat completion"
#: Why a reply whose only call was in the thinking is asked again (`called_in_thinking`).
_IN_THINKING = "the model's call came inside its thinking, with no call and no answer"
#: A completion without choices (some proxies and overloaded servers): retried the same way.
_NO_CHOICES = "the model server returned no choices"
#: How a timeout's reason begins; `_timed_out` adds the setting that bounds the call.
_TIMED_OUT = "the model server timed out"
_UNREACHABLE = "the model server is unreachable"
#: How the reason of a 429 answer begins (`_outcome`).
_RATE_LIMITED = "HTTP 429:"
#: Reasons of a server that is away or overloaded rather than refusing this request: a
#: timeout, no connection, 408 or a 5xx. Past the retries the round is handed back for later
#: (`ModelBusy`), not failed: a model server restarting for a minute must not fail every task
#: that was running.
_AWAY = re.compile(r"HTTP (408|5\d\d):")
#: An answer past the cap: retried like an unreadable one (a proxy's hiccup, a looping model).
_TOO_LARGE = (
    f"the model server's answer is larger than {MAX_MODEL_ANSWER_BYTES // (1024 * 1024)} MiB "
    "(the cap on a model answer)"
)
_NO_KEY = "not-needed"  # local servers take no key; the client insists on a value
#: What the host's own call ids are drawn from (`_own_id`): Mistral's template takes no other.
_ID_CHARS = string.ascii_letters + string.digits
#: The longest tool-call id kept as the server sent it (the transcript's column); a longer or
#: missing one is replaced by an id of the host's, used consistently in the history.
MAX_CALL_ID_CHARS = 128


class OpenAIModel(Model):
    """One round's conversation with an OpenAI-compatible server."""

    def __init__(
        self,
        model: str,
        client: openai.OpenAI,
        *,
        max_output_tokens: int,
        timeout: float,
        max_retries: int,
        temperature: float | None = None,
        deadline: Callable[[], float] | None = None,
        secret: str | None = None,
        context_window: int | None = None,
    ) -> None:
        self.model = model
        self.client = client
        self.max_output_tokens = max_output_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.deadline = deadline
        self._secret = secret
        #: LLM_CONTEXT_WINDOW, named when the server says a request is past its own window.
        self.context_window = context_window
        self.calls = 0
        #: Which server and model `server_params` remembers refused parameters for.
        self._server = (str(client.base_url), model)
        #: The field the server names a reasoning model's thinking by, in its answers and in
        #: the history sent back (DeepSeek's `reasoning_content` until one says `reasoning`).
        self._reasoning_field = "reasoning_content"
        #: The tool-call ids of this conversation's earlier turns, as the server sent them (the
        #: first turn's, to recognise a server numbering its ids per turn) and as the history
        #: holds them (every one, so a renamed id never meets another).
        self._first_ids: tuple[str, ...] = ()
        self._held: set[str] = set()
        self._own_ids = False
        #: The replies read so far, and what sets this round's own call ids apart from another
        #: round's (`_turn`).
        self._turns = 0
        self._round_tag = secrets.token_hex(3)

    @classmethod
    def from_settings(
        cls, model: str, settings: Settings, *, deadline: Callable[[], float] | None = None
    ) -> OpenAIModel:
        if not settings.llm_base_url:
            raise ModelError("ORCH_MODEL=openai:... needs LLM_BASE_URL")
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else ""
        client = client_for(settings.llm_base_url, key or _NO_KEY, settings.llm_timeout_seconds)
        return cls(
            model,
            client,
            max_output_tokens=settings.llm_max_output_tokens,
            timeout=settings.llm_timeout_seconds,
            max_retries=settings.llm_max_retries,
            temperature=settings.llm_temperature,
            deadline=deadline,
            secret=key or None,
            context_window=settings.llm_context_window,
        )

    def request(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
    ) -> dict[str, Any]:
        """The body of one chat-completions request (checked for strict servers)."""
        wire = to_wire_messages(messages)
        if self._reasoning_field != "reasoning_content":
            # Sent back under the name the server reads it by (an assistant message of the wire
            # is a dict of its own).
            for message in wire:
                if "reasoning_content" in message:
                    message[self._reasoning_field] = message.pop("reasoning_content")
        try:
            check_history(wire)
        except HistoryError as exc:
            raise ModelError(f"the agent built an invalid history: {exc}") from None
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire,
            "max_tokens": self.max_output_tokens,
        }
        if tools:
            body["tools"] = to_wire_tools(tools)
            body["parallel_tool_calls"] = True
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        body = self.request(messages, tools)
        budget = RetryBudget(self.max_retries, deadline=self.deadline)
        #: The last reply whose call was in the thinking, asked again (`called_in_thinking`).
        thought: ModelTurn | None = None
        while True:
            if stop.is_set():
                return ModelTurn(content=None, tool_calls=())
            self.calls += 1
            started = time.monotonic()
            # The whole LLM_TIMEOUT_SECONDS, not the lease's window as it stands now: the
            # heartbeat renews the lease while the call is in flight, and a lease in doubt sets
            # `stop`, which ends the wait below at once.
            sent = adapt(self._server, body)  # without what the server refused before
            call = submit(self._create, sent, self.timeout)
            waited = wait(call, stop, started + self.timeout)
            if waited == "stopped":
                # Cancelled or the lease is in doubt: the round stops now; the abandoned call
                # ends by itself within its timeout (`model_http`).
                return ModelTurn(content=None, tool_calls=())
            if waited == "late":
                # Not done within the timeout (a dribbling answer, a slow connect): a timeout
                # like any other; the abandoned call gives its connection up by itself.
                call.cancel()
                self._count("unreachable", started)
                reason, retry_after = self._timed_out(), None
            else:
                outcome = self._outcome(call, started, sent)
                if isinstance(outcome, ModelTurn):
                    turn = as_calls(named(outcome, tools), tools)
                    if not called_in_thinking(turn, tools):
                        return turn
                    # vLLM #39056 strikes some replies, not all: asked again, the model may
                    # call the tool as a call. Past the retries the round ends on it.
                    thought, reason, retry_after = turn, _IN_THINKING, None
                elif outcome is None:
                    continue  # a parameter the server refused is left out: at once, once
                else:
                    reason, retry_after = outcome
            delay = budget.next_delay(retry_after)
            if isinstance(delay, str) and thought is not None and reason == _IN_THINKING:
                return thought  # recorded, then `model_error` naming the server's fix
            if isinstance(delay, str):
                if reason.startswith(_RATE_LIMITED):
                    # A rate limit outlasting the retries: handed back, not failed (ModelBusy).
                    raise ModelBusy(
                        f"the model server is rate limiting ({reason}); {delay}", retry_after
                    )
                if reason.startswith(_TIMED_OUT) or reason == _UNREACHABLE or _AWAY.match(reason):
                    raise ModelBusy(
                        f"the model server is unavailable ({reason}); {delay}", retry_after
                    )
                raise ModelError(f"model call failed ({reason}); {delay}")
            if stop.wait(delay):
                return ModelTurn(content=None, tool_calls=())

    def _outcome(
        self, call: Future[Any], started: float, sent: dict[str, Any]
    ) -> ModelTurn | tuple[str, float | None] | None:
        """The finished call's turn, or why it failed and the Retry-After the server asked for,
        or None when the server refused an optional parameter of `sent` (`server_params`: the
        next call leaves it out); a failure not worth retrying raises `ModelError`."""
        try:
            completion = call.result()
        except (openai.APITimeoutError, httpx2.TimeoutException):
            # httpx2's own when the body of an error status came too slowly (`model_http`).
            self._count("unreachable", started)
            return self._timed_out(), None
        except openai.APIConnectionError:
            self._count("unreachable", started)
            return _UNREACHABLE, None
        except CorruptAnswer:
            self._count("unreadable", started)
            return _UNREADABLE, None
        except RecursionError:  # JSON nested past what json reads (a looping model's `[[[`)
            self._count("unreadable", started)
            return f"{_UNREADABLE}: it is nested too deeply to read", None
        except AnswerTooLarge:
            self._count("unreadable", started)
            return _TOO_LARGE, None
        except openai.APIStatusError as exc:
            status = exc.status_code
            self._count(f"http_{status}", started)
            headers = dict(exc.response.headers)
            if not should_retry(status, headers) or tools_refused(self._describe(exc)):
                error = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
                if refused_parameter(self._server, status, error, sent, self._describe(exc)):
                    return None
                hint = refusal_hint(
                    status, self._describe(exc), self.model, self.context_window, self._secret
                )
                raise ModelError(
                    f"the model server refused the request: HTTP {status}: "
                    f"{self._describe(exc)}{hint}"
                ) from None
            return f"HTTP {status}: {self._describe(exc)}", parse_retry_after(headers)
        except json.JSONDecodeError as exc:
            # Said to be JSON and not: a stream under `application/json` (some gateways) is
            # read as a stream; anything else is unreadable.
            completion = exc.doc
        except openai.APIResponseValidationError:
            self._count("unreadable", started)
            return _UNREADABLE, None
        if isinstance(completion, str):  # not JSON: a proxy's error page, or a stream
            if not is_event_stream(completion):
                self._count("unreadable", started)
                return _UNREADABLE, None
            try:
                # A stream the request did not ask for (`streamed`): the reply it holds.
                completion = ChatCompletion.construct(**assembled(completion))
            except StreamError as exc:
                self._count("unreadable", started)
                return self._redacted(str(exc))[:400], None
        if not getattr(completion, "choices", None):
            self._count("no_choices", started)
            said = self._error_of(completion)
            wrong = wrong_endpoint(said, self._server[0])
            if wrong is not None:  # LM Studio's answer to a path it does not serve: no retry
                raise ModelError(wrong)
            upstream = error_status(completion)
            if upstream is not None:
                # A gateway's upstream status at 200 (OpenRouter's 429): rate limited or away,
                # as that HTTP status would be, so the round is handed back past its retries.
                return f"HTTP {upstream}: {_NO_CHOICES}{said}, at HTTP 200", None
            # An error object at 200 from a base URL without its /v1 names no setting.
            hint = base_path_hint(self._server[0]) if said else ""
            return _NO_CHOICES + said + hint, None
        problem = shape_problem(completion.choices[0])
        if problem is not None:
            # A choice without a message (a server's error in the choice's place), or parts of
            # it in a wrong shape: unreadable, and the reason says which part.
            self._count("unreadable", started)
            return f"{_UNREADABLE}: {problem}", None
        turn = self._turn(completion)
        self._count("ok", started, turn.usage)
        return turn

    def _timed_out(self) -> str:
        """A timeout's reason, naming the setting to raise for a model that is slow, not away
        (a large model's long answer on a busy GPU)."""
        return f"{_TIMED_OUT}: no answer within LLM_TIMEOUT_SECONDS={self.timeout:g}s"

    def _count(self, status: str, started: float, usage: TokenUsage | None = None) -> None:
        """The call in the Prometheus metrics: its outcome, latency and tokens."""
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.MODEL_CALLS.labels(self.model, status).inc()
        metrics.MODEL_LATENCY.labels(self.model).observe(time.monotonic() - started)
        if usage is not None:
            metrics.MODEL_TOKENS.labels(self.model, "prompt").inc(usage.prompt_tokens)
            metrics.MODEL_TOKENS.labels(self.model, "completion").inc(usage.completion_tokens)

    def _create(self, body: dict[str, Any], timeout: float) -> Any:
        return self.client.chat.completions.create(**body, timeout=timeout)

    def _describe(self, exc: openai.APIStatusError) -> str:
        return described(exc, self._secret)

    def _error_of(self, completion: Any) -> str:
        return error_of(completion, self._secret)

    def _redacted(self, text: str) -> str:
        return redacted(text, self._secret)

    def _turn(self, completion: Any) -> ModelTurn:
        choice = completion.choices[0]
        message = choice.message
        cut_off = self._cut_off(getattr(choice, "finish_reason", None))
        calls: list[ToolCall] = []
        malformed: list[tuple[str, str]] = []
        raw_arguments: list[tuple[str, str]] = []
        seen: set[str] = set()
        sent_ids: set[str] = set()  # as the server sent them: a repeat in one turn is refused
        self._turns += 1
        tool_calls = message.tool_calls or legacy_call(message)
        last = len(tool_calls)
        numbered = self._numbers_per_turn(tool_calls)
        for number, call in enumerate(tool_calls, start=1):
            function = getattr(call, "function", None)
            if function is None:
                continue  # a custom (non-function) tool call: nothing here can run it
            # Read without a gpt-oss server's leaked harmony markers (`argument_markers`).
            arguments, problem, markers = read_arguments(function.arguments)
            # The limit cuts the reply's end: only its last call can be cut; an earlier one that
            # cannot be read, or a repeated id, is the model's mistake, not the limit's.
            cut = cut_off is not None and number == last
            call_id = id_text(call)
            repeated = bool(call_id) and call_id in sent_ids
            sent_ids.add(call_id)
            if repeated or call_id in seen:
                cut = False
                # Two calls of one turn under one id: a history repeating it is refused, so it
                # goes on under an id of its own, answered `failed` without running.
                problem = f"the call id {short_id(call_id)!r} is repeated in this turn"
                call_id = ""
            elif numbered:
                # The server numbers its ids per turn ("0", "call_0" in every reply): its id
                # names a call within this turn only, so the call goes on under the id scoped
                # to the round and the turn. The host's rule for a repeated id (refused with
                # other arguments) then holds for ids that name a call, not for the server's
                # counter: in a later turn, or in a later generation of the task (one session).
                call_id = self._scoped(call_id)
            if not call_id or len(call_id) > MAX_CALL_ID_CHARS:
                # The host's own: the round's, so a later generation of the task (the same
                # session, where a write's receipt is keyed by its call id) never meets it.
                call_id = self._own_id()
            seen.add(call_id)
            self._held.add(call_id)
            name = clean_text(function.name) if isinstance(function.name, str) else ""
            if not name and problem is None:
                problem = "the call names no tool"
            if problem is not None and cut:
                problem = f"{problem}; {cut_off}: make the call smaller"
            calls.append(ToolCall(call_id, name, arguments, sent_markers=markers))
            if problem is not None:
                malformed.append((call_id, problem))
                raw = raw_text(function.arguments)
                if raw:
                    raw_arguments.append((call_id, raw))
        reasoning = getattr(message, "reasoning_content", None)
        if reasoning is None and message.model_extra:
            reasoning = message.model_extra.get("reasoning_content")
            if reasoning is None and isinstance(message.model_extra.get("reasoning"), str):
                # vLLM since 0.10 (and OpenRouter, LM Studio): `reasoning`, which its chat
                # templates also read back from the history.
                reasoning = message.model_extra["reasoning"]
                self._reasoning_field = "reasoning"
        content = message.content
        if isinstance(content, list):
            # Content as parts (Mistral's reasoning models: thinking, then text): the text is
            # the reply, the thinking its reasoning; the rest of the loop takes text only.
            content, thought = parts_text(content)
            if reasoning is None:
                reasoning = thought
        usage = None
        if completion.usage is not None:
            usage = TokenUsage(
                prompt_tokens=token_count(completion.usage, "prompt_tokens"),
                completion_tokens=token_count(completion.usage, "completion_tokens"),
            )
        return ModelTurn(
            content=clean_text(content) if isinstance(content, str) else content,
            tool_calls=tuple(calls),
            reasoning_content=clean_text(reasoning) if isinstance(reasoning, str) else None,
            usage=usage,
            malformed=tuple(malformed),
            raw_arguments=tuple(raw_arguments),
            cut_off=cut_off,
        )

    def _numbers_per_turn(self, calls: Sequence[Any]) -> bool:
        """Whether the server numbers tool-call ids per turn: every turn with calls so far
        starts its ids as the first such turn did (`0`, `1`, ... or `call_0`, ... again). A
        server with ids of its own per call gives a later turn a fresh first id, and then an id
        repeated from an earlier turn is the model's, which the host judges as it comes."""
        ids = tuple(id_text(call) for call in calls)
        if not ids or not ids[0]:
            return False  # no id to judge by (the host gives the call one of its own)
        if not counters(ids):
            # An id of the server's own (`call_a1`, vLLM's `chatcmpl-tool-<hex>`) is never a
            # per-turn number: the same one in a later turn is the model repeating a call.
            self._own_ids = True
            return False
        if not self._first_ids:
            # Counted from 0 or 1 in the first turn: scoped from that turn on (the next
            # generation's first turn counts from 0 again, in the same session).
            self._first_ids = ids
            return not self._own_ids
        if not all(a == b for a, b in zip(ids, self._first_ids, strict=False)):
            self._own_ids = True  # a fresh first id: the server's ids are its own per call
        return not self._own_ids

    def _own_id(self) -> str:
        """A call id of the host's: 9 letters and digits, the one form every server takes back
        (Mistral's chat template refuses any other: "must be a-z, A-Z, 0-9, with a length of
        9"), random (53 bits) so that a later generation of the task never meets it, and never
        one this conversation holds."""
        while True:
            call_id = "".join(secrets.choice(_ID_CHARS) for _ in range(9))
            if call_id not in self._held:
                return call_id

    def _scoped(self, call_id: str) -> str:
        """`call_id` made unique to this round (its tag) and turn (`call_0~3fa2c1t2`)."""
        scoped = f"{call_id}~{self._round_tag}t{self._turns}"
        extra = 1
        while scoped in self._held:
            extra += 1
            scoped = f"{call_id}~{self._round_tag}t{self._turns}.{extra}"
        return scoped

    def _cut_off(self, finish_reason: Any) -> str | None:
        """Why the server ended the reply before the model did, or None."""
        if finish_reason == "length":
            return (
                f"the model's reply was cut off at LLM_MAX_OUTPUT_TOKENS="
                f"{self.max_output_tokens} tokens (finish_reason=length)"
            )
        if finish_reason == "content_filter":
            return "the model server withheld the rest of the reply (finish_reason=content_filter)"
        return None
