"""The host's evidence recorder: every citable result of an execution becomes a record.

Called by the tool host after a tool returned and its result was paged: the tool says what it
knows (`Tool.evidence_facts`: source, declared origin, its own truncation, rows); the host adds
its clock, the parameters' digest, the content hash and `result_id`, its own truncation (a
result it cut to a preview), and writes the record fenced. The model supplies none of it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from orchestrator.agent.text import clean_text
from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.fingerprints import NonCanonical, fingerprint
from orchestrator.domain.times import wire_time
from orchestrator.errors import StaleGeneration
from orchestrator.store import evidence as evidence_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.store.types import utcnow
from orchestrator.tools.base import ToolContext

__all__ = ["CITATION_CHARS", "DESCRIBED_LIMIT", "Citation", "EvidenceRecorder", "described"]

#: The most of a command line (or the like) a record's summary repeats.
DESCRIBED_LIMIT = 200

#: The characters of a `Citation`'s values beside a result (an evidence id, a time with six
#: fraction digits, a SHA-256 reference), the same for every record. What they tokenize to
#: depends on their random digits; a token is at least one byte, so these bound it.
CITATION_CHARS: Final = (
    len(str(uuid.UUID(int=0)))
    + len(wire_time(datetime(2000, 1, 1, tzinfo=UTC)))
    + len(evidence_store.content_ref("0" * 64))
)


@dataclass(frozen=True)
class Citation:
    """What the model is shown of the record beside the result (seed 004: a query result
    carries its source, time, content reference and origin; the result has source and origin)."""

    evidence_id: str
    queried_at: str
    content_ref: str


class EvidenceRecorder:
    def __init__(self, db: Database) -> None:
        self.db = db

    def cite(
        self, ctx: ToolContext, facts: EvidenceFacts, *, cut: bool, result_id: str | None
    ) -> Citation | None:
        """Write one record for `ctx`'s generation: what the model is shown of it (its id,
        query time and content reference), or None outside an execution.

        Raises `StaleGeneration` when the generation was fenced out (nothing is written).
        """
        fence = ctx.fence
        if fence is None:
            return None
        text = _text(facts.content)
        truncated = facts.truncated or cut
        rows = "" if facts.row_count is None else f"{facts.row_count} row(s), "
        said = "" if facts.described is None else f" {described(facts.described)}"
        summary = (
            f"{facts.kind} {facts.source}{said}: {rows}{len(text)} character(s), origin "
            f"{facts.origin}{', truncated' if truncated else ''}"
        )
        row = evidence_store.EvidenceRow(
            task_id=fence.task_id,
            generation=fence.generation,
            session_id=ctx.session_id,
            kind=facts.kind,
            source=facts.source[:128],
            origin=facts.origin,
            truncated=truncated,
            params_digest=_digest(facts.params),
            content_hash=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            result_id=result_id,
            row_count=facts.row_count,
            char_count=len(text),
            summary=summary,
            queried_at=utcnow(),
        )
        if self.db.dialect == "postgresql":
            # The fence check in the same statement, sent in autocommit.
            fenced = evidence_store.insert_record_fenced(self.db.engine, fence, row)
            if fenced is None:
                raise StaleGeneration(
                    f"generation {fence.generation} of task {fence.task_id} is no longer live"
                )
            return _citation(fenced["evidence_id"], row)
        with self.db.transaction() as conn:
            check_fence(conn, fence)
            stored = evidence_store.insert_record(conn, row)
        return _citation(stored["evidence_id"], row)


def described(text: str) -> str:
    """What a result came from, as a one-line summary holds it: control characters (a newline
    of a multi-line command) shown as spaces, NUL and lone surrogates replaced, clipped to
    `DESCRIBED_LIMIT` with its length said, and quoted."""
    line = "".join(" " if ord(char) < 32 or ord(char) == 127 else char for char in text)
    line = clean_text(line)
    if len(line) > DESCRIBED_LIMIT:
        line = f"{line[:DESCRIBED_LIMIT]}... ({len(text)} characters)"
    return f"`{line}`"


def _citation(evidence_id: Any, row: evidence_store.EvidenceRow) -> Citation:
    # As the record reads back (`store.evidence.public`): the same instant and reference.
    return Citation(
        str(evidence_id), wire_time(row.queried_at), evidence_store.content_ref(row.content_hash)
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def _digest(params: Any) -> str:
    try:
        return fingerprint(params)
    except (NonCanonical, TypeError, ValueError):
        return hashlib.sha256(_text(params).encode("utf-8")).hexdigest()
