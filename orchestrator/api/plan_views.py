"""Response models of the plan routes: a stored revision of seed 004's execution plan, the
history `{session_id, latest, revisions}` the console reads, and a task's current plan.

They describe what `PlanRecord.to_dict()` and `store.plans.list_summaries` already send; a
route that returns them sets `response_model_exclude_unset` so a node's optional `action_id` and
`evidence_ids` stay absent when the stored node has none, as they always were.

A node or an edge an older version stored in another shape (no actor, a status no longer known,
a field of another type, not an object) is sent as its JSON text (`api.older_shapes`), the rest
of the revision as usual; the stored plan is not changed, and new publishes are validated as
before.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.api.enums import NodeActor, NodeStatus
from orchestrator.api.older_shapes import items_as_text_unless
from orchestrator.api.wire_types import IsoTime

__all__ = [
    "PlanEdgeView",
    "PlanHistoryView",
    "PlanNodeView",
    "PlanRevisionView",
    "PlanSummaryView",
    "TaskPlanView",
    "plan_as_sent",
]

#: How many nodes are in each status, every status listed (progress is counts, not time).
StatusCounts = dict[NodeStatus, int]


class PlanNodeView(BaseModel):
    id: str = Field(description="unique and stable across revisions")
    title: str
    actor: NodeActor = Field(description="never changes; only a person closes a human node")
    description: str = ""
    evidence: str = Field(default="", description="what supports a completed node")
    status: NodeStatus
    reason: str | None = Field(default=None, description="why a node failed or waits")
    action_id: str | None = Field(
        default=None, description="the action proposed for this node (absent when none)"
    )
    evidence_ids: list[str] | None = Field(
        default=None, description="recorded evidence the node cites (absent when none)"
    )


class PlanEdgeView(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    from_: str = Field(alias="from", description="the node that comes first")
    to: str
    label: str | None = Field(description="the condition of a conditional branch")


class PlanRevisionView(BaseModel):
    """One stored revision; the server assigned schema_version, session_id, revision and
    updated_at."""

    schema_version: str = Field(description="execution-plan@1")
    session_id: str
    revision: int
    request_id: str
    title: str
    reason: str
    nodes: list[PlanNodeView | str] = Field(
        description="a node an older version stored in another shape is its JSON text"
    )
    edges: list[PlanEdgeView | str] = Field(
        description="an edge an older version stored in another shape is its JSON text"
    )
    status_counts: StatusCounts
    task_id: str | None
    generation: int | None
    updated_at: IsoTime
    retries: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "which nodes retry each failed node, as the host keeps it (seed 004: a retry is a "
            "new node of the failed node's actor, drawn from it at or after the failure; a node "
            "that followed it before it failed is none); a failed node holds the completion "
            "until one of its retries is completed"
        ),
    )

    @field_validator("nodes", mode="before")
    @classmethod
    def _older_nodes_as_text(cls, nodes: Any) -> list[Any]:
        return items_as_text_unless(PlanNodeView, nodes)

    @field_validator("edges", mode="before")
    @classmethod
    def _older_edges_as_text(cls, edges: Any) -> list[Any]:
        return items_as_text_unless(PlanEdgeView, edges)


class PlanSummaryView(BaseModel):
    """A revision of the history, without its nodes and edges."""

    revision: int
    updated_at: IsoTime
    title: str
    reason: str
    status_counts: StatusCounts


class PlanHistoryView(BaseModel):
    """The latest revision in full and every revision's summary, oldest first."""

    session_id: str
    latest: PlanRevisionView | None = Field(description="null before the first publish")
    revisions: list[PlanSummaryView]


class TaskPlanView(BaseModel):
    task_id: str
    plan: PlanRevisionView | None = Field(
        description="the task's latest revision, whichever session holds it; null before its "
        "first plan"
    )


def plan_as_sent(plan: dict[str, Any]) -> dict[str, Any]:
    """A revision (`PlanRecord.to_dict()`) as the plan routes send it, for the streams and the
    CLI: a node or edge of an older shape is its JSON text, an absent optional key stays absent."""
    return PlanRevisionView.model_validate(plan).model_dump(mode="json", exclude_unset=True)
