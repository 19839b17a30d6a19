"""Evidence the host vouches for, and what a report or a completed node may claim from it
(seed 004: 查询结果携带来源、时间、内容引用和 origin; 截断结果不能用来断言完整范围无异常;
DESIGN invariants 12 and 21).

Pure: the facts a tool reports about its own result (never the model's arguments), and the
rules a report's citations must pass. Every problem is collected, so the model fixes all at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.domain.plan_fields import Problem, problem

__all__ = [
    "LIVE",
    "REPORT_CODES",
    "EvidenceFacts",
    "Finding",
    "report_problems",
]

LIVE: Final = "live"

#: Codes a refused `save_report` can carry (the table of docs/evidence.md lists them).
REPORT_CODES: Final = (
    "unknown_evidence",
    "evidence_required",
    "truncated_evidence",
    "origin_mismatch",
)


@dataclass(frozen=True)
class EvidenceFacts:
    """What a tool knows of one result it returned, for the host's evidence record.

    `origin` comes from the source's declaration, `truncated` from the limits the tool applied;
    the host adds its own truncation (a result it cut to a preview) and the clock.
    """

    kind: str  # data_source, call_api, command
    source: str
    origin: str
    truncated: bool
    row_count: int | None
    params: Any  # digested, never stored
    content: Any  # hashed and counted, never stored
    #: What the result came from, in words for the record's summary (a command's line, never
    #: its `env`): the digest alone did not let an operator see that a `live` record was an
    #: `echo`. Dropped by the host for a sensitive call.
    described: str | None = None


@dataclass(frozen=True)
class Finding:
    """One finding of a report as the rules see it."""

    text: str
    evidence_ids: tuple[str, ...]
    whole_range: bool
    origin: str | None  # the origin the finding presents its data as, when it says


def report_problems(
    *,
    outcome: str,
    cited: Sequence[str],
    findings: Sequence[Finding],
    presented_origin: str | None,
    records: Mapping[str, Mapping[str, Any]],
) -> list[Problem]:
    """Every problem of a report's citations against the task's `records` (by evidence id)."""
    found: list[Problem] = []
    everything = list(dict.fromkeys([*cited, *(i for f in findings for i in f.evidence_ids)]))
    for evidence_id in everything:
        if evidence_id not in records:
            found.append(
                problem(
                    "unknown_evidence",
                    f"{evidence_id!r} is not an evidence record of this task; cite the "
                    "evidence_id a query returned",
                    evidence_id=evidence_id,
                )
            )
    known = [i for i in everything if i in records]
    if outcome == "completed" and not known:
        found.append(
            problem(
                "evidence_required",
                "a completed report cites at least one evidence record (evidence_ids)",
            )
        )
    for index, finding in enumerate(findings):
        # A finding that names no record rests on everything the report cites.
        basis = [i for i in (finding.evidence_ids or tuple(known)) if i in records]
        if finding.whole_range:
            cut = [i for i in basis if records[i].get("truncated")]
            if cut:
                found.append(
                    problem(
                        "truncated_evidence",
                        f"findings[{index}] claims the whole range but rests on truncated "
                        f"record(s) {', '.join(cut)}; query the rest or narrow the claim",
                        finding=index,
                        evidence_ids=cut,
                    )
                )
        if finding.origin == LIVE:
            found.extend(_not_live(basis, records, f"findings[{index}]", finding=index))
    if presented_origin == LIVE:
        found.extend(_not_live(known, records, "the report"))
    return found


def _not_live(
    basis: Sequence[str], records: Mapping[str, Mapping[str, Any]], what: str, **where: Any
) -> list[Problem]:
    other = [i for i in basis if records[i].get("origin") != LIVE]
    if not other:
        return []
    origins = sorted({str(records[i].get("origin")) for i in other})
    return [
        problem(
            "origin_mismatch",
            f"{what} presents data as live, but record(s) {', '.join(other)} are "
            f"{'/'.join(origins)}: say so instead",
            evidence_ids=other,
            **where,
        )
    ]
