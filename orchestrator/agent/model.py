"""The model interface (one call → text and/or tool calls) and the scripted model.

`openai:<model>` is the OpenAI-compatible client in `orchestrator.agent.openai_model`.

The scripted model is a public interface: with `ORCH_MODEL=scripted:DIR`, a task of type T runs
the script `DIR/T.json`, a list of turns, each one model response:

    {"turns": [
      {"delay_s": 0.5, "tool_calls": [{"id": "c1", "name": "read_task_context", "arguments": {}}]},
      {"content": "final answer"}
    ]}

`delay_s` is the model's thinking time before the turn. A new generation starts from turn one.
A string argument `${CALL_ID.path}` takes a value an earlier result of the round returned
(`orchestrator.agent.script_refs`), e.g. `"${q1.evidence_id}"`.

A test hook: with `"record_requests": true` in the script, every request the model receives
(its messages and tool names) is appended as one JSON line to `<script>.requests.jsonl` beside
the script, so a test can check what a model was given (and what it was not).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.agent.script_refs import resolve_refs
from orchestrator.settings import Settings, SettingsError, get_settings
from orchestrator.tools.base import ToolCall

__all__ = [
    "Model",
    "ModelBusy",
    "ModelError",
    "ModelTurn",
    "ScriptedModel",
    "TokenUsage",
    "check_model_setting",
    "load_model",
]


class ModelError(Exception):
    """The model cannot go on (a broken script, an unreachable service); the round fails."""


class ModelBusy(ModelError):
    """The model server rate-limits the round (HTTP 429), or is away (unreachable, timing out,
    408, 5xx), for longer than its retries may wait. Neither the agent's fault nor lasting:
    the round hands its generation back to run again once `retry_after` (the server's
    Retry-After, seconds; None when it gave none: then after a back-off) has passed, rather
    than failing the task."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class TokenUsage:
    """What one model call cost, as the server reported it."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ModelTurn:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    #: A reasoning model's thoughts; sent back with the turn when it calls tools.
    reasoning_content: str | None = None
    usage: TokenUsage | None = None
    #: Calls whose arguments could not be read (call id → why): answered `failed`, never run.
    malformed: tuple[tuple[str, str], ...] = ()
    #: What the model sent as the arguments of those calls (call id → the first 500
    #: characters, cleaned), for the transcript only: the history carries `{}`.
    raw_arguments: tuple[tuple[str, str], ...] = ()
    #: Why the server cut the reply short (its output limit, a content filter); None when the
    #: model ended it. A cut reply without tool calls is not a final answer.
    cut_off: str | None = None
    #: Why a reply without tool calls is no answer: it holds a call the server did not return
    #: as one (`reply_parts.as_calls`). The round ends `model_error` with it once the turn is
    #: recorded, so the transcript shows what the model wrote and the call's tokens count.
    unparsed: str | None = None

    @property
    def final(self) -> bool:
        return not self.tool_calls


class Model(ABC):
    """One model conversation for one round."""

    @abstractmethod
    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        """The next response; returns early (final, empty) when `stop` is set."""

    def check_tools(self, tool_names: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Raise `ModelError` if the model will call tools the host does not have."""

    def summary_turn(
        self, messages: Sequence[dict[str, Any]], stop: threading.Event
    ) -> ModelTurn | None:
        """The answer (and token usage) of a summary call for context compaction: one call
        without tools. None when this model makes no such call."""
        return self.next_turn(messages, [], stop)

    def summarize(self, messages: Sequence[dict[str, Any]], stop: threading.Event) -> str | None:
        """A summary of `messages` for context compaction. None when the model gives none (the
        caller then falls back to a deterministic digest)."""
        turn = self.summary_turn(messages, stop)
        return None if turn is None or turn.tool_calls else turn.content


class _ScriptCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _ScriptTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delay_s: float = Field(default=0.0, ge=0, le=3600)
    content: str | None = None
    tool_calls: list[_ScriptCall] = Field(default_factory=list)


class _Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turns: list[_ScriptTurn] = Field(min_length=1)
    record_requests: bool = False


class ScriptedModel(Model):
    """Plays a script of turns; when it runs out, the round ends with a final answer."""

    def __init__(
        self, turns: Sequence[_ScriptTurn], name: str = "script", record_to: Path | None = None
    ) -> None:
        self._turns = list(turns)
        self._next = 0
        self._results: dict[str, Any] = {}  # the round's tool results, for `${...}` references
        self.name = name
        self.record_to = record_to

    @classmethod
    def from_file(cls, path: Path) -> ScriptedModel:
        try:
            version = path.stat()
        except OSError:
            script = _read_script(path)  # which says what is wrong with the file
        else:
            # A script changed on disk is read again: its size or modification time differs.
            script = _read_version(path, version.st_mtime_ns, version.st_size)
        record_to = (
            path.with_name(path.name + ".requests.jsonl") if script.record_requests else None
        )
        return cls(script.turns, name=path.name, record_to=record_to)

    def check_tools(self, tool_names: Sequence[str]) -> None:
        known = set(tool_names)
        for number, turn in enumerate(self._turns, start=1):
            for call in turn.tool_calls:
                if call.name not in known:
                    raise ModelError(
                        f"script {self.name} turn {number} calls unknown tool {call.name!r}"
                    )

    def summary_turn(
        self, messages: Sequence[dict[str, Any]], stop: threading.Event
    ) -> ModelTurn | None:
        # A script is a list of turns; a summary call must not consume one.
        return None

    def next_turn(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stop: threading.Event,
    ) -> ModelTurn:
        if self.record_to is not None:
            request = {"messages": list(messages), "tools": [t.get("name") for t in tools]}
            with self.record_to.open("a", encoding="utf-8") as out:
                out.write(json.dumps(request, default=str, ensure_ascii=False) + "\n")
        if self._next >= len(self._turns):
            return ModelTurn(content=None, tool_calls=())
        turn = self._turns[self._next]
        self._next += 1
        if turn.delay_s and stop.wait(turn.delay_s):
            return ModelTurn(content=None, tool_calls=())
        # A copy each time: the turns are shared by every round that plays this script version.
        # `resolve_refs` makes it (every dict and list of what it returns is new) while it puts
        # in the ids the host returned earlier for `${CALL_ID.path}` (`agent.script_refs`).
        calls = tuple(
            ToolCall(c.id, c.name, resolve_refs(c.arguments, messages, self._results))
            for c in turn.tool_calls
        )
        return ModelTurn(content=turn.content, tool_calls=calls)


@dataclass(frozen=True)
class _ReadScript:
    turns: tuple[_ScriptTurn, ...]
    record_requests: bool


def _read_script(path: Path) -> _ReadScript:
    """The validated turns of a script file, or `ModelError` saying what is wrong with it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no script for this task type: {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"script {path} is not readable JSON: {exc}") from None
    try:
        script = _Script.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ModelError(f"script {path} is malformed at {where}: {first['msg']}") from None
    return _ReadScript(tuple(script.turns), script.record_requests)


@lru_cache(maxsize=64)
def _read_version(path: Path, _mtime_ns: int, _size: int) -> _ReadScript:
    """The turns of one version of a script file, read once (errors are not kept)."""
    return _read_script(path)


def load_model(
    spec: str | None,
    task_type: str,
    *,
    settings: Settings | None = None,
    deadline: Callable[[], float] | None = None,
) -> Model:
    """The model named by `ORCH_MODEL` for one round of a task of `task_type`.

    `deadline` gives the monotonic time until which the round's lease is vouched for; an
    `openai:` model never waits for a retry past it.
    """
    if not spec:
        raise ModelError(
            "ORCH_MODEL is not set; use openai:MODEL (with LLM_BASE_URL) or scripted:DIR"
        )
    kind, _, target = spec.partition(":")
    if kind == "scripted" and target:
        if not _safe_name(task_type):
            raise ModelError(f"task type {task_type!r} cannot name a script file")
        return ScriptedModel.from_file(Path(target) / f"{task_type}.json")
    if kind == "openai" and target:
        from orchestrator.agent.openai_model import OpenAIModel  # only when configured

        return OpenAIModel.from_settings(target, settings or get_settings(), deadline=deadline)
    raise ModelError(f"unsupported ORCH_MODEL {spec!r}; use openai:MODEL or scripted:DIR")


def check_model_setting(settings: Settings) -> None:
    """Refuse to start a worker without a usable `ORCH_MODEL` (no silent default).

    Raises `SettingsError` with one line naming the setting.
    """
    spec = settings.model
    if not spec:
        raise SettingsError(
            "invalid setting ORCH_MODEL: not set; use openai:MODEL (with LLM_BASE_URL) "
            "or scripted:DIR"
        )
    kind, _, target = spec.partition(":")
    if kind == "scripted" and target:
        if not Path(target).is_dir():
            raise SettingsError(
                f"invalid setting ORCH_MODEL: the script folder {target} does not exist"
            )
        return
    if kind == "openai" and target:
        if not settings.llm_base_url:
            raise SettingsError(
                "invalid setting LLM_BASE_URL: ORCH_MODEL=openai:... needs the server's URL, "
                "e.g. http://127.0.0.1:8000/v1"
            )
        return
    raise SettingsError(
        f"invalid setting ORCH_MODEL: {spec!r} is neither openai:MODEL nor scripted:DIR"
    )


def _safe_name(name: str) -> bool:
    return bool(name) and all(ch.isalnum() or ch in "_-." for ch in name) and ".." not in name
