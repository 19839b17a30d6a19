"""The data sources `query_data_source` may query (seed 004): their declaration file, read and
checked at start.

Sources are declared in a YAML or JSON file (`ORCH_DATA_SOURCES`): name, description, kind,
`origin` (`live`, `synthetic`, `peripheral_sample`, fixed per source), limits (rows, characters,
time range) and timeout. Without the setting the bundled declaration is used
(`data_sources.yaml`: the simulated SCADA source `scada_sim`, synthetic). The name
`sample_input` is reserved: a task triggered with `sample_input` has that source, its own fixed
input. A file that cannot be used is `DataSourceError`, one line naming the setting, and a
worker stops on it at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.tools.openapi import load_spec
from orchestrator.tools.spec_errors import SpecError

__all__ = [
    "BUNDLED",
    "SAMPLE_SOURCE",
    "SETTING",
    "DataSource",
    "DataSourceError",
    "Limits",
    "load_sources",
]

SETTING: Final = "ORCH_DATA_SOURCES"
SAMPLE_SOURCE: Final = "sample_input"
BUNDLED: Final = Path(__file__).with_name("data_sources.yaml")


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
