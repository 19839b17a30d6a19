"""A data source's rows as `query_data_source` shows them: within the source's limits and
within the context window, with `truncated` and why.

The declared limits (rows, characters) bound the envelope, and so does the context window (a
quarter of it, `WHOLE_FIT`: fewer rows, never a cut row). The result is not paged (the model
sees all of it), so `truncated` is exactly the limits applied, and the envelope says what the
model did not see and how to read it: a narrower range, or for the task's sample input
read_task_context, which returns it whole a page at a time. A sample input too large for the
window (one object: the trigger's) is shown with the leading items of its largest list that fit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from orchestrator.domain.times import wire_time
from orchestrator.store.types import utcnow
from orchestrator.tools.base import ToolContext, ToolResult
from orchestrator.tools.results import WHOLE_FIT, fitting
from orchestrator.tools.source_declarations import SAMPLE_SOURCE, Limits

__all__ = ["envelope", "least_shown", "sample_envelope"]


def envelope(
    name: str,
    origin: str,
    start: datetime,
    end: datetime,
    rows: list[Any],
    limit: int,
    limits: Limits,
    *,
    partial: str | None = None,
    ctx: ToolContext | None = None,
) -> ToolResult:
    """The rows within the limits, and within what `ctx`'s context window takes (`WHOLE_FIT`;
    none without a `ctx`), with `truncated` and why."""
    kept = rows[:limit]
    why: list[str] = [partial] if partial else []
    if len(rows) > limit:
        why.append(f"row limit {limit} reached ({len(rows)} rows in range)")
    # Characters: drop whole rows from the end until the rows fit.
    rows_text = _json(kept)
    while kept and len(rows_text) > limits.max_chars:
        kept = kept[: max(0, len(kept) - max(1, len(kept) // 10))]
        rows_text = _json(kept)
        if not why or "character" not in why[-1]:
            why.append(f"character limit {limits.max_chars} reached")
    head = {"source": name, "origin": origin, "start": wire_time(start), "end": wire_time(end)}
    return _fitted(head, kept, rows_text, why, ctx)


def sample_envelope(sample: Any, ctx: ToolContext) -> ToolResult:
    """The task's sample input (source `sample_input`, origin `peripheral_sample`, with its
    note) within what `ctx`'s context window takes (`WHOLE_FIT`), as a range's rows are; one
    object too large for it whole is shown cut (`_cut_sample`)."""
    rows = sample if isinstance(sample, list) else [sample]
    # Fitted to the window as any source's rows are: a large sample input whole was a
    # request past the window, and the round failed `context_overflow` on every try.
    whole = _fitted(_SAMPLE_HEAD, rows, _json(rows), [], ctx, note=_SAMPLE_NOTE)
    if whole.payload["row_count"] or not isinstance(sample, dict):
        return whole
    return _cut_sample(sample, ctx) or whole


def _fitted(
    head: dict[str, Any],
    kept: list[Any],
    rows_text: str,
    why: list[str],
    ctx: ToolContext | None,
    *,
    note: str | None = None,
) -> ToolResult:
    """`head` with the most of `kept` (whose JSON is `rows_text`) that `ctx`'s context window
    takes (`WHOLE_FIT`; all without a `ctx`), with `truncated` and why. With a `note`, the
    rows are the task's sample input, which has no range to narrow."""
    sample = note is not None

    def written(shown: list[Any], rows_text: str) -> tuple[dict[str, Any], str]:
        reasons = list(why)
        if len(shown) < len(kept):
            # The result is not paged (the model sees all of it, so `truncated` is exactly what
            # it saw): in a small context window it shows fewer rows instead.
            after = kept[len(shown)]
            at = after.get("time") if isinstance(after, dict) else None
            if sample:
                # The business backend's input: say which part the model did not see, and
                # where the whole of it is (read_task_context pages a large result).
                unseen = (
                    f"rows {len(shown) + 1} to {len(kept)} are not shown"
                    if len(kept) > 1
                    else f"its one row ({len(_json(after))} characters) is not shown"
                )
                reasons.append(
                    f"the context window (LLM_CONTEXT_WINDOW) takes {len(shown)} of the "
                    f"sample input's {len(kept)} rows: {unseen}; read_task_context returns "
                    "the sample input whole, a page at a time"
                )
            else:
                reasons.append(
                    f"the context window (LLM_CONTEXT_WINDOW) takes {len(shown)} of {len(kept)} "
                    "rows; query a narrower range (start, end) for the rest"
                    + (f" (the next row's time is {at})" if isinstance(at, str) else "")
                    if shown
                    else f"the context window (LLM_CONTEXT_WINDOW) takes none of the "
                    f"{len(kept)} rows beside the prompt, the tool definitions and the turn's "
                    "other calls: call it alone in a turn, or an operator must make room "
                    "(LLM_MAX_TOOLS, LLM_MAX_OUTPUT_TOKENS or a larger window)"
                )
        tail: dict[str, Any] = {"row_count": len(shown), "truncated": bool(reasons)}
        if reasons:
            tail["truncation"] = "; ".join(reasons) + (
                ": the rows are only part of the sample input"
                if sample
                else ": the rows cover only part of the range"
            )
        if note is not None:
            tail["note"] = note
        payload = {**head, "rows": shown, **tail}
        # The payload's text from the rows' text just measured, not the rows written again.
        return payload, _json(head)[:-1] + ', "rows": ' + rows_text + ", " + _json(tail)[1:]

    def fits(count: int) -> tuple[dict[str, Any], str] | None:
        shown = kept[:count]
        envelope = written(shown, rows_text if count == len(kept) else _json(shown))
        if ctx is None or fitting(ctx, envelope[1], whole=True) >= len(envelope[1]):
            return envelope
        return None

    envelope = fits(len(kept))
    if envelope is None:
        # The most rows whose envelope fits what one answer may show (`WHOLE_FIT`); none at
        # worst (the envelope then says why).
        envelope = fits(_most_that_fit(fits, len(kept) - 1)) or written([], "[]")
    payload, text = envelope
    return ToolResult.ok(payload).with_payload_text(text)


#: A context window that takes none of a result's rows (`QueryDataSource.least_shown`).
_NO_ROOM: Final = ToolContext("", "", "", extras={WHOLE_FIT: lambda _text: 0})


@functools.lru_cache(maxsize=64)
def least_shown(name: str, origin: str, max_rows: int) -> str | None:
    """The envelope of none of a source's rows (of as many as its limit lets a range hold:
    their count is written; bounded, only the count's digits matter), with a time of the
    wire's length. Once per source: it is measured, never shown."""
    rows: list[Any] = [None] * min(max_rows, 9999)
    if name == SAMPLE_SOURCE:
        shown = _fitted(_SAMPLE_HEAD, rows, _json(rows), [], _NO_ROOM, note=_SAMPLE_NOTE)
    else:
        at = wire_time(utcnow())
        head = {"source": name, "origin": origin, "start": at, "end": at}
        shown = _fitted(head, rows, _json(rows), [], _NO_ROOM)
    return shown.written_payload()


_SAMPLE_HEAD: Final = {"source": SAMPLE_SOURCE, "origin": "peripheral_sample"}
_SAMPLE_NOTE: Final = "the trigger's fixed sample input: never present it as a live query"


def _cut_sample(sample: dict[str, Any], ctx: ToolContext | None) -> ToolResult | None:
    """A sample input too large for the window (one object: the trigger's), shown with the
    leading items of its largest list that fit, and which items are not shown; None when it
    has no list, or the rest of it alone does not fit. The whole of it stays readable, a page
    at a time, through read_task_context."""
    lists = [key for key, value in sample.items() if isinstance(value, list) and value]
    if not lists:
        return None
    key = max(lists, key=lambda name: len(_json(sample[name])))
    items: list[Any] = sample[key]

    def shown(count: int) -> ToolResult | None:
        row = {**sample, key: items[:count]}
        why = [
            f"the context window (LLM_CONTEXT_WINDOW) takes {count} of the {len(items)} items "
            f"of the sample input's {key!r}: items {count + 1} to {len(items)} are not shown; "
            "read_task_context returns the sample input whole, a page at a time"
        ]
        result = _fitted(_SAMPLE_HEAD, [row], _json([row]), why, ctx, note=_SAMPLE_NOTE)
        return result if result.payload["row_count"] else None

    # The most items that fit (the whole list did not).
    if shown(0) is None:
        return None
    return shown(_most_that_fit(shown, len(items) - 1))


def _most_that_fit(fits: Callable[[int], object | None], most: int) -> int:
    """The largest count from 0 to `most` for which `fits(count)` is not None, found by
    bisection (a larger count never fits where a smaller one does not); 0 when none does."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle) is not None:
            low = middle
        else:
            high = middle - 1
    return low


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
