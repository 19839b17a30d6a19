"""`query_data_source`: bounded, audited queries of declared data sources (seed 004).

Sources are declared in a YAML or JSON file (`ORCH_DATA_SOURCES`): name, description, kind,
`origin` (`live`, `synthetic`, `peripheral_sample`, fixed per source), limits (rows, characters,
time range) and timeout. Without the setting the bundled declaration is used: the simulated
SCADA source (`scada_sim`, synthetic). A task triggered with `sample_input` also has the source
`sample_input`, origin `peripheral_sample`: its own fixed input, never a live query.

Kinds: `scada_sim` (the bundled simulator), `http_json` (a GET operation of an OpenAPI 3
document, like the gateway: parameters validated against the operation) and, implicitly,
`sample_input`. The host records every successful query as evidence; the origin and the
truncation in that record come from here, never from the model's arguments.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.times import wire_time
from orchestrator.errors import ValidationFailed
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.types import utcnow
from orchestrator.tools import scada_sim
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult
from orchestrator.tools.http_answers import AnswerTooLarge, read_answer
from orchestrator.tools.openapi import load_spec
from orchestrator.tools.paging import more_past
from orchestrator.tools.results import WHOLE_FIT, fitting
from orchestrator.tools.spec_errors import SpecError

__all__ = [
    "BUNDLED",
    "SETTING",
    "DataSource",
    "DataSourceError",
    "QueryDataSource",
    "load_sources",
]

SETTING: Final = "ORCH_DATA_SOURCES"
SAMPLE_SOURCE: Final = "sample_input"
BUNDLED: Final = Path(__file__).with_name("data_sources.yaml")


class _NotRead(Exception):
    """A source's answer that is not rows (the message says why)."""


class DataSourceError(Exception):
    """The declaration file cannot be used; the message is one line naming the setting."""


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_rows: int = Field(default=500, ge=1, le=100_000)
    max_chars: int = Field(default=50_000, ge=100, le=1_000_000)
    max_range_hours: float = Field(default=48.0, gt=0, le=24 * 366)
    default_range_hours: float = Field(default=24.0, gt=0, le=24 * 366)


class DataSource(BaseModel):
    """One declared source."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = Field(min_length=1, max_length=500)
    kind: Literal["scada_sim", "http_json"]
    origin: Literal["live", "synthetic", "peripheral_sample"]
    limits: Limits = Field(default_factory=Limits)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    # http_json: the OpenAPI document (relative to the declaration file), base URL, operation.
    spec: str | None = None
    base_url: str | None = None
    operation_id: str | None = None
    # The operation's query parameters that take the range (ISO 8601); unset = not sent.
    from_param: str | None = None
    to_param: str | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sources: list[DataSource] = Field(min_length=1, max_length=50)


def load_sources(
    path: Path | None, *, tool_timeout_seconds: float | None = None
) -> dict[str, DataSource]:
    """The declared sources by name (the bundled file when `path` is None); `DataSourceError`
    with one line when the file cannot be used.

    With `tool_timeout_seconds` (ORCH_TOOL_TIMEOUT_SECONDS), a source that calls out must time
    out below it: otherwise the host gives a slow query up before the source's own
    `source_timeout` answer could come. A query makes one attempt (no retry), so its
    `timeout_seconds` is what is compared; the simulator calls nothing and is not.
    """
    where = f"{SETTING} ({path or BUNDLED})"
    source_path = path or BUNDLED
    try:
        text = source_path.read_text(encoding="utf-8")
        raw = json.loads(text) if source_path.suffix == ".json" else yaml.safe_load(text)
    except OSError as exc:
        raise DataSourceError(f"{where}: cannot read the file: {exc.strerror or exc}") from None
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataSourceError(f"{where}: not valid JSON/YAML: {first}") from None
    try:
        declared = _File.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        at = ".".join(str(part) for part in error["loc"]) or "(file)"
        raise DataSourceError(f"{where}: {at}: {error['msg']}") from None
    sources: dict[str, DataSource] = {}
    for source in declared.sources:
        if source.name in sources or source.name == SAMPLE_SOURCE:
            raise DataSourceError(f"{where}: source name {source.name!r} is used twice or reserved")
        if source.kind == "scada_sim" and source.origin != "synthetic":
            raise DataSourceError(f"{where}: {source.name}: the simulator's origin is synthetic")
        if source.kind == "http_json":
            source = _check_http(where, source, source_path.parent)
            _check_timeout(where, source, tool_timeout_seconds)
        sources[source.name] = source
    return sources


def _check_timeout(where: str, source: DataSource, tool_timeout: float | None) -> None:
    if tool_timeout is not None and source.timeout_seconds >= tool_timeout:
        raise DataSourceError(
            f"{where}: {source.name}: timeout_seconds must be below ORCH_TOOL_TIMEOUT_SECONDS "
            f"({source.timeout_seconds:g} >= {tool_timeout:g}), or the host gives every slow "
            "query up first"
        )


def _check_http(where: str, source: DataSource, folder: Path) -> DataSource:
    if not (source.spec and source.base_url and source.operation_id):
        raise DataSourceError(
            f"{where}: {source.name}: an http_json source needs spec, base_url and operation_id"
        )
    spec_path = folder / source.spec
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        raise DataSourceError(f"{where}: {source.name}: {exc.message}") from None
    operation = spec.operations.get(source.operation_id)
    if operation is None or operation.method != "GET":
        raise DataSourceError(
            f"{where}: {source.name}: {source.operation_id!r} is not a GET operation of the spec"
        )
    return source.model_copy(update={"spec": str(spec_path)})


class QueryArgs(ToolArguments):
    source: str = Field(min_length=1, max_length=64)
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="the source's own parameters (scada_sim: point, measure)"
    )
    start: AwareDatetime | None = Field(default=None, description="range start, with time zone")
    end: AwareDatetime | None = Field(default=None, description="range end (default: now)")
    max_rows: int | None = Field(default=None, ge=1, description="at most the declared limit")

    @field_validator("start", "end")
    @classmethod
    def _in_the_calendar(cls, value: datetime | None) -> datetime | None:
        # The year 1 or 9999 overflowed the range's arithmetic ("OverflowError").
        if value is not None and not 1900 <= value.year <= 2999:
            raise ValueError("must be a time between the years 1900 and 2999")
        return value


class QueryDataSource(Tool):
    name = "query_data_source"
    description = (
        "Query a declared data source within its limits. The result carries source, origin "
        "(live, synthetic or peripheral_sample, from the source's declaration), whether it was "
        "truncated, and the host's record of it (evidence_id, queried_at, content_ref): cite "
        "the evidence_id in save_report and in "
        "the evidence_ids of a completed plan node. A truncated result cannot support a claim "
        "about its whole range. Sources: "
    )
    effect = "read"
    arguments = QueryArgs
    # The declared character limit bounds the envelope, and so does the context window (a
    # quarter of it, `WHOLE_FIT`: fewer rows, never a cut row); the model sees all of it (not
    # paged), so `truncated` is exactly the limits this tool applied.
    pageable = False

    def __init__(self, db: Database, sources: dict[str, DataSource]) -> None:
        self.db = db
        self.sources = sources

    def schema(self) -> dict[str, Any]:
        body = super().schema()
        listed = "; ".join(
            f"{s.name} ({s.kind}, origin {s.origin}): {s.description}"
            for s in self.sources.values()
        )
        body["description"] = (
            self.description + listed + f"; {SAMPLE_SOURCE} (the task's own sample input, "
            "origin peripheral_sample, when it has one)"
        )
        return body

    def least_shown(self, args: Any) -> str | None:
        """None of the rows, and why (`_fitted` in a window that takes none of them): a
        range's envelope, or the sample input's; None for an unknown source (a short refusal)."""
        assert isinstance(args, QueryArgs)
        if args.source == SAMPLE_SOURCE:
            return _least_shown(SAMPLE_SOURCE, "peripheral_sample", 2)
        source = self.sources.get(args.source)
        if source is None:
            return None
        return _least_shown(source.name, source.origin, source.limits.max_rows)

    def looks_up(self, args: Any) -> bool:
        """A query of a source that is not declared is refused at once (`unknown_source`)."""
        return not self.records_evidence(args)

    def records_evidence(self, args: Any = None) -> bool:
        """A query of an unknown source is refused, and records nothing (nor needs its room)."""
        if isinstance(args, QueryArgs) and args.source != SAMPLE_SOURCE:
            return args.source in self.sources
        return True

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        assert isinstance(args, QueryArgs)
        if args.source == SAMPLE_SOURCE:
            return self._sample(ctx)
        source = self.sources.get(args.source)
        if source is None:
            names = ", ".join([*self.sources, SAMPLE_SOURCE])
            return ToolResult.failed(
                f"unknown source {args.source!r}; declared: {names}", code="unknown_source"
            )
        end = args.end or utcnow()
        start = args.start or end - timedelta(hours=source.limits.default_range_hours)
        problems = self._range_problems(source, start, end)
        if problems:
            return ToolResult.failed("; ".join(problems), code="invalid_arguments")
        try:
            rows, partial = self._fetch(source, args.parameters, start, end)
        except ValidationFailed as exc:
            return ToolResult.failed(exc.message, code="invalid_arguments")
        except httpx.TimeoutException:
            return ToolResult.failed(
                f"{source.name} did not answer within {source.timeout_seconds} s",
                code="source_timeout",
            )
        except (AnswerTooLarge, _NotRead) as exc:
            return ToolResult.failed(f"{source.name} could not be read: {exc}", code="source_error")
        except (httpx.HTTPError, ValueError) as exc:
            return ToolResult.failed(
                f"{source.name} could not be read: {type(exc).__name__}", code="source_error"
            )
        limit = min(args.max_rows or source.limits.max_rows, source.limits.max_rows)
        return _envelope(
            source.name,
            source.origin,
            start,
            end,
            rows,
            limit,
            source.limits,
            partial=partial,
            ctx=ctx,
        )

    def evidence_facts(self, args: Any, result: ToolResult) -> EvidenceFacts | None:
        payload = result.payload
        if result.status != "succeeded" or not isinstance(payload, dict):
            return None
        # Origin from the declaration (or the sample input's fixed origin), never from args.
        declared = self.sources.get(args.source)
        origin = declared.origin if declared is not None else "peripheral_sample"
        return EvidenceFacts(
            kind="data_source",
            source=args.source,
            origin=origin,
            truncated=bool(payload.get("truncated")),
            row_count=len(payload.get("rows") or []),
            params=args.model_dump(mode="json"),
            content=payload.get("rows"),
        )

    # -- sources ------------------------------------------------------------------------------

    @staticmethod
    def _range_problems(source: DataSource, start: datetime, end: datetime) -> list[str]:
        problems = []
        if end <= start:
            problems.append("end must be after start")
        hours = (end - start).total_seconds() / 3600
        if hours > source.limits.max_range_hours:
            problems.append(
                f"a range of {hours:.1f} h is above the {source.limits.max_range_hours} h limit "
                f"of {source.name}; query it in parts"
            )
        return problems

    def _fetch(
        self, source: DataSource, parameters: dict[str, Any], start: datetime, end: datetime
    ) -> tuple[list[Any], str | None]:
        """The rows of the range, and why they are only part of it when the source said so."""
        if source.kind == "scada_sim":
            point = parameters.get("point", scada_sim.POINTS[0])
            measure = parameters.get("measure")
            extra = set(parameters) - {"point", "measure"}
            if extra or point not in scada_sim.POINTS or measure not in scada_sim.MEASURES:
                raise ValidationFailed(
                    f"scada_sim takes point (one of {', '.join(scada_sim.POINTS)}) and measure "
                    f"(one of {', '.join(scada_sim.MEASURES)})"
                )
            return scada_sim.readings(point, measure, start, end), None
        return self._http(source, parameters, start, end)

    def _http(
        self, source: DataSource, parameters: dict[str, Any], start: datetime, end: datetime
    ) -> tuple[list[Any], str | None]:
        assert source.spec is not None
        assert source.base_url is not None
        assert source.operation_id is not None
        operation = load_spec(Path(source.spec)).operations[source.operation_id]
        query = dict(parameters)
        if source.from_param:
            query[source.from_param] = start.isoformat()
        if source.to_param:
            query[source.to_param] = end.isoformat()
        try:
            operation.model.model_validate(query)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            raise ValidationFailed(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        with httpx.Client(base_url=source.base_url, timeout=source.timeout_seconds) as client:
            request = client.build_request("GET", operation.path, params=query)
            answer = read_answer(client, request, body_seconds=source.timeout_seconds)
        if not 200 <= answer.status_code < 300:
            raise _NotRead(f"it answered HTTP {answer.status_code}")
        body = answer.json()
        rows = body.get("rows", body.get("items")) if isinstance(body, dict) else body
        if not isinstance(rows, list):
            raise _NotRead("the answer holds no list of rows")
        return rows, more_past(body, len(rows))

    def _sample(self, ctx: ToolContext) -> ToolResult:
        if ctx.task_id is None:
            return ToolResult.failed("this session does not belong to a task", code="no_task")
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, ctx.task_id)
        if task is None or task.sample_input is None:
            return ToolResult.failed("this task has no sample input", code="unknown_source")
        sample = task.sample_input
        rows = sample if isinstance(sample, list) else [sample]
        # Fitted to the window as any source's rows are: a large sample input whole was a
        # request past the window, and the round failed `context_overflow` on every try.
        whole = _fitted(_SAMPLE_HEAD, rows, _json(rows), [], ctx, note=_SAMPLE_NOTE)
        if whole.payload["row_count"] or not isinstance(sample, dict):
            return whole
        return _cut_sample(sample, ctx) or whole


def _envelope(
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
def _least_shown(name: str, origin: str, max_rows: int) -> str | None:
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
