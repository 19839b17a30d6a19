"""`query_data_source`: bounded, audited queries of declared data sources (seed 004).

Sources are declared in a YAML or JSON file (`ORCH_DATA_SOURCES`, read by `source_declarations`):
name, description, kind, `origin` (`live`, `synthetic`, `peripheral_sample`, fixed per source),
limits (rows, characters, time range) and timeout. Without the setting the bundled declaration
is used: the simulated SCADA source (`scada_sim`, synthetic). A task triggered with
`sample_input` also has the source `sample_input`, origin `peripheral_sample`: its own fixed
input, never a live query.

Kinds: `scada_sim` (the bundled simulator), `http_json` (a GET operation of an OpenAPI 3
document, like the gateway: parameters validated against the operation) and, implicitly,
`sample_input`. The host records every successful query as evidence; the origin and the
truncation in that record come from this tool (its rows fitted to the limits and the context
window by `source_rows`), never from the model's arguments.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import AwareDatetime, Field, ValidationError, field_validator

from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.errors import ValidationFailed
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.types import utcnow
from orchestrator.tools import scada_sim, source_rows
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult
from orchestrator.tools.http_answers import AnswerTooLarge, read_answer
from orchestrator.tools.openapi import load_spec
from orchestrator.tools.paging import more_past
from orchestrator.tools.source_declarations import SAMPLE_SOURCE, DataSource

__all__ = ["QueryDataSource"]


class _NotRead(Exception):
    """A source's answer that is not rows (the message says why)."""


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
        """None of the rows, and why (`source_rows._fitted` in a window that takes none of them): a
        range's envelope, or the sample input's; None for an unknown source (a short refusal)."""
        assert isinstance(args, QueryArgs)
        if args.source == SAMPLE_SOURCE:
            return source_rows.least_shown(SAMPLE_SOURCE, "peripheral_sample", 2)
        source = self.sources.get(args.source)
        if source is None:
            return None
        return source_rows.least_shown(source.name, source.origin, source.limits.max_rows)

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
        return source_rows.envelope(
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
        return source_rows.sample_envelope(task.sample_input, ctx)
