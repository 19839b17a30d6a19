"""Large tool results: kept in memory per session graph, paged by Unicode character offset.

Seed 000 (工具结果与大结果续读): above the preview size the full text stays in this process only,
under a 32-character `result_id`; at most 1 MiB a result, 8 results and 4 MiB a graph, 15 minutes.
Over capacity, after a graph rebuild or a process exit the id is invalid and says so. Another
session cannot read it, and a result read with higher clearance cannot be read after the
reader's clearance dropped. Never written to disk or to logs.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = [
    "MAX_PAGE",
    "NO_PREVIEW_NOTE",
    "PAGE_NOTE",
    "PREVIEW_CHARS",
    "PREVIEW_FIT",
    "RESULT_FIT",
    "WHOLE_FIT",
    "ReadToolResult",
    "ResultCache",
    "Stored",
    "clearance_of",
    "fitting",
]

PREVIEW_CHARS = 4000
#: The key of `ToolContext.extras` holding how much of a text one answer may show the model:
#: `fit(text) -> characters from its start`, set by the agent from the context window (a preview
#: and a page of 4,000 and 16,000 characters do not fit a 4,096-token window). Unset: no limit
#: but the sizes above (the internal bridge, a collaboration answer).
RESULT_FIT = "result_fit"
#: As `RESULT_FIT`, for a large result's preview, `fit(text, total) -> characters` (`total`: the
#: result's length, of which `text` is the start): 0 when the window leaves no room for a preview
#: worth showing (the answer then says how to read it, `ToolHost._page`), and the whole text when
#: it is the whole result and takes no more room than its preview's answer would. Unset:
#: `RESULT_FIT`'s.
PREVIEW_FIT = "preview_fit"
#: As `RESULT_FIT`, for a result shown whole and never paged (a data source's rows): a larger
#: share of the window (`ContextBudget.whole_result_tokens`), within which the tool shows fewer
#: rows and says so.
WHOLE_FIT = "whole_fit"
MAX_PAGE = 16000
#: The note of a large result's preview (`agent.host.ToolHost._page`).
PAGE_NOTE = "read the rest with read_tool_result(result_id, offset)"
#: Its note when the context window left no room for a preview worth showing beside the turn's
#: other calls (`PREVIEW_FIT`): nothing of it is shown, and the model reads it from offset 0.
NO_PREVIEW_NOTE = (
    "nothing shown: no room in this turn; read it with read_tool_result(result_id, offset) "
    "in a later turn, with fewer calls"
)
MAX_RESULT_BYTES = 1024 * 1024
MAX_RESULTS_PER_GRAPH = 8
MAX_BYTES_PER_GRAPH = 4 * 1024 * 1024
TTL_SECONDS = 15 * 60


def fitting(ctx: ToolContext, text: str, *, whole: bool = False, preview: int | None = None) -> int:
    """How many characters from the start of `text` an answer may show (`RESULT_FIT`, or
    `WHOLE_FIT` for a result that is not paged); at least one of a non-empty text, so that
    paging always moves on. `preview`: the length of a large result whose start `text` is,
    for its preview (`PREVIEW_FIT`): none when the window leaves no room for one worth
    showing."""
    fit = ctx.extras.get(PREVIEW_FIT) if preview is not None else None
    if callable(fit) and text:
        return max(0, min(len(text), int(fit(text, preview))))
    fit = ctx.extras.get(WHOLE_FIT if whole else RESULT_FIT)
    if not callable(fit) or not text:
        return len(text)
    return max(1, min(len(text), int(fit(text))))


def clearance_of(ctx: ToolContext) -> int:
    """The reader's clearance: `ctx.extras["clearance"]` (an int, higher = more privileged),
    else 1, and 0 for a read-only caller. A sub-agent shares its main agent's session graph
    but not its rights (seed 000: 管理员结果在降权后不能续读): what the main agent read, a
    sensitive value among it, is not the sub-agent's to page, and its answer would carry it
    into the transcript."""
    value = ctx.extras.get("clearance")
    if isinstance(value, int):
        return value
    return 0 if ctx.readonly else 1


@dataclass(frozen=True)
class Stored:
    """The answer to `put`: an id when the text was kept, else why not."""

    result_id: str | None
    total_chars: int
    reason: str | None = None


@dataclass
class _Entry:
    owner: str
    clearance: int
    text: str
    size: int
    expires_at: float


class ResultCache:
    """All session graphs' large results of this process; thread-safe."""

    def __init__(
        self,
        *,
        ttl_seconds: float = TTL_SECONDS,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_results: int = MAX_RESULTS_PER_GRAPH,
        max_graph_bytes: int = MAX_BYTES_PER_GRAPH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_result_bytes = max_result_bytes
        self.max_results = max_results
        self.max_graph_bytes = max_graph_bytes
        self._clock = clock
        self._lock = threading.Lock()
        # session id -> result id -> entry, oldest first (eviction order)
        self._graphs: dict[str, OrderedDict[str, _Entry]] = {}

    def put(self, ctx: ToolContext, text: str) -> Stored:
        """Keep `text` for the session graph of `ctx`; evicts the oldest results when full."""
        size = len(text.encode("utf-8"))
        if size > self.max_result_bytes:
            return Stored(None, len(text), "the full result is larger than 1 MiB; narrow the query")
        result_id = secrets.token_hex(16)  # 32 characters
        now = self._clock()
        with self._lock:
            graph = self._graphs.setdefault(ctx.session_id, OrderedDict())
            self._expire(graph, now)
            while graph and (
                len(graph) >= self.max_results
                or sum(e.size for e in graph.values()) + size > self.max_graph_bytes
            ):
                graph.popitem(last=False)
            graph[result_id] = _Entry(
                owner=ctx.owner,
                clearance=clearance_of(ctx),
                text=text,
                size=size,
                expires_at=now + self.ttl_seconds,
            )
        return Stored(result_id, len(text))

    def read(self, ctx: ToolContext, result_id: str, offset: int, limit: int) -> dict[str, Any]:
        """A page `[offset, offset+limit)` of a kept result; `LookupError` if it is not readable.

        A result of another session, of another owner, or kept at a higher clearance than the
        reader's reads as invalid, exactly like an expired one: its existence is not disclosed.
        """
        with self._lock:
            graph = self._graphs.get(ctx.session_id)
            entry = None
            if graph is not None:
                self._expire(graph, self._clock())
                entry = graph.get(result_id)
            if entry is None or entry.owner != ctx.owner or clearance_of(ctx) < entry.clearance:
                raise LookupError(
                    "result_id is invalid: it expired, was evicted for capacity, its session "
                    "graph was rebuilt or the process restarted, or it is not readable here; "
                    "run the original query again, narrower if possible"
                )
            text = entry.text
        total = len(text)
        if offset > total:
            raise IndexError(f"offset {offset} is past the end ({total} characters)")
        page = text[offset : offset + limit]
        end = offset + len(page)
        return {
            "result_id": result_id,
            "offset": offset,
            "content": page,
            "next_offset": end if end < total else None,
            "total_chars": total,
        }

    def drop_graph(self, session_id: str) -> None:
        """Forget every result of a session graph (graph rebuilt or released)."""
        with self._lock:
            self._graphs.pop(session_id, None)

    def count(self, session_id: str) -> int:
        with self._lock:
            graph = self._graphs.get(session_id)
            if graph is None:
                return 0
            self._expire(graph, self._clock())
            return len(graph)

    @staticmethod
    def _expire(graph: OrderedDict[str, _Entry], now: float) -> None:
        for key in [key for key, entry in graph.items() if entry.expires_at <= now]:
            del graph[key]


class ReadToolResultArgs(ToolArguments):
    result_id: str = Field(min_length=32, max_length=32, description="id from a preview")
    offset: int = Field(default=0, ge=0, description="Unicode character offset to start at")
    limit: int = Field(default=MAX_PAGE, ge=1, le=MAX_PAGE, description="characters to read")


class ReadToolResult(Tool):
    """`read_tool_result`: page through a large result without running the tool again."""

    name = "read_tool_result"
    description = (
        "Read more of a large tool result by its result_id, from a Unicode character offset "
        f"(at most {MAX_PAGE} characters a call, fewer when the context window is small). Use "
        "next_offset from the previous page."
    )
    effect = "read"
    arguments = ReadToolResultArgs
    pageable = False  # its pages (up to 16,000 characters) are the paging

    def __init__(self, cache: ResultCache) -> None:
        self.cache = cache

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        assert isinstance(args, ReadToolResultArgs)
        try:
            page = self.cache.read(ctx, args.result_id, args.offset, args.limit)
        except LookupError as exc:
            return ToolResult.failed(str(exc), code="result_invalid")
        except IndexError as exc:
            return ToolResult.failed(str(exc), code="offset_out_of_range")
        content = page["content"]
        shown = fitting(ctx, content)
        if shown < len(content):
            # The page the context window can take: the next one starts where it ends.
            page = {**page, "content": content[:shown], "next_offset": args.offset + shown}
        return ToolResult.ok(page)
