"""The schema: one SQLAlchemy Core table per record of DESIGN section 2.

The constraints carry the invariants; Alembic migrations in `alembic/versions` build exactly this.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ColumnElement,
    ForeignKey,
    FromClause,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    literal_column,
    or_,
)

from orchestrator.domain import vocabulary as v
from orchestrator.domain.outcomes import UNRESOLVED
from orchestrator.domain.storable import NAME_MAX
from orchestrator.store.types import JSONDocument, UTCDateTime

__all__ = [
    "OPEN_LEASE",
    "PENDING_ACTION",
    "actions",
    "attempted_pending",
    "collaboration_messages",
    "console_account_signouts",
    "console_signouts",
    "evidence",
    "executions",
    "invocation_receipts",
    "leases",
    "metadata",
    "outbox",
    "plan_revisions",
    "recovery_snapshots",
    "reports",
    "sessions",
    "settled",
    "task_events",
    "tasks",
    "transcript_entries",
    "unresolved_receipt",
    "unsettled",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ID = 36  # uuid4 as text
NAME = 64


def one_of(column: str, values: Iterable[str], name: str | None = None) -> CheckConstraint:
    """A CHECK that `column` holds one of `values`."""
    listed = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({listed})", name=name or column)


tasks = Table(
    "tasks",
    metadata,
    Column("task_id", String(ID), primary_key=True),
    Column("task_type", String(NAME), nullable=False),
    Column("title", String(200), nullable=False),
    Column("context", JSONDocument, nullable=False),
    Column("sample_input", JSONDocument, nullable=True),
    Column("trigger_id", String(128), nullable=False),
    Column("origin", String(24), nullable=False),
    Column("status", String(16), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("session_id", String(ID), nullable=True),
    Column("failure_code", String(NAME), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("recoveries", Integer, nullable=False, server_default="0"),
    # Losses in a row of generations their workers handed back after an outage (see
    # `executions.handed_back_at`), counted apart from `recoveries` (ORCH_MAX_HANDBACKS).
    Column("handbacks", Integer, nullable=False, server_default="0"),
    Column("rounds", Integer, nullable=False, server_default="0"),
    Column("intent_round", Integer, nullable=False, server_default="1"),
    Column("queued_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("trigger_id"),
    one_of("status", v.TASK_STATUSES),
    one_of("origin", v.TASK_ORIGINS),
    CheckConstraint("generation >= 1", name="generation_positive"),
    Index(None, "status", "updated_at"),
    Index(None, "status", "queued_at"),  # the sweeper's stale-queued query
    Index(None, "created_at"),
    # The task list filtered by status or by type, newest first (keyset on created_at).
    Index(None, "status", "created_at"),
    Index(None, "task_type", "created_at"),
    # Both at once (migration 0022): a pair no task has, each alone common, walked every task.
    Index(None, "status", "task_type", "created_at"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("session_id", String(ID), primary_key=True),
    Column("purpose", String(24), nullable=False),
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=True),
    Column("generation", Integer, nullable=True),
    Column("owner", String(NAME_MAX), nullable=False),  # a name, or "task:<id>"
    Column("title", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    one_of("purpose", v.SESSION_PURPOSES),
    CheckConstraint(
        "purpose = 'ordinary_chat' OR task_id IS NOT NULL", name="task_sessions_name_task"
    ),
    Index(None, "purpose", "created_at", "session_id"),
    Index(None, "task_id"),
)

executions = Table(
    "executions",
    metadata,
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("session_id", String(ID), nullable=False),
    Column("celery_task_id", String(NAME), nullable=True),
    Column("worker", String(255), nullable=True),
    Column("lease_token", String(NAME), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("failure_code", String(NAME), nullable=True),
    Column("reason", Text, nullable=True),
    # Where the claim ran (orchestrator/leases/process.py): a restarted worker or a sweep on
    # that host requeues the generations of its processes that are gone, without the lease.
    Column("worker_host", String(255), nullable=True),
    Column("worker_pid", Integer, nullable=True),
    Column("worker_started", String(128), nullable=True),
    # Set when the claiming worker stopped its round on an outage (the store or Redis failed,
    # its lease was taken or went overdue) and gave the generation back (services/handback.py).
    Column("handed_back_at", UTCDateTime, nullable=True),
    PrimaryKeyConstraint("task_id", "generation"),
    one_of("outcome", v.EXECUTION_OUTCOMES),
    CheckConstraint("generation >= 1", name="generation_positive"),
    Index(None, "worker_host", "outcome"),
)

#: A claimed generation still open: its lease mirrored here (set at the claim, kept while it
#: runs or waits, handed back). The predicate of the partial index below; the sweep's reads of
#: expired leases imply it (`lease_expires_at < now` is never true of a null). A queued
#: generation is not in it: a backlog of thousands leaves the index as small as the generations
#: that run. An index that also held the queued ones (on `outcome, lease_expires_at`, before
#: 0030) was the planner's choice for a fenced write's `outcome IS NULL` whenever its statistics
#: predated the backlog, and every fenced write read the whole backlog.
OPEN_LEASE = and_(executions.c.outcome.is_(None), executions.c.lease_expires_at.is_not(None))
Index("ix_executions_open_leases", executions.c.lease_expires_at, postgresql_where=OPEN_LEASE,
      sqlite_where=OPEN_LEASE)  # fmt: skip

plan_revisions = Table(
    "plan_revisions",
    metadata,
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("revision", Integer, nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("schema_version", String(32), nullable=False),
    Column("title", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("nodes", JSONDocument, nullable=False),
    Column("edges", JSONDocument, nullable=False),
    Column("content_digest", String(64), nullable=False),
    Column("task_id", String(ID), nullable=True),
    Column("generation", Integer, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    # Which node retries which failed node, `{failed_id: [retry ids]}` (`domain.retries`):
    # history a revision's edges cannot show. NULL on a revision stored before it was kept.
    Column("retries", JSONDocument, nullable=True),
    PrimaryKeyConstraint("session_id", "revision"),
    UniqueConstraint("session_id", "request_id"),
    CheckConstraint("revision >= 1", name="revision_positive"),
    Index(None, "task_id", "generation"),
)

reports = Table(
    "reports",
    metadata,
    Column("report_id", String(ID), primary_key=True),
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("generation", Integer, nullable=False),
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("summary", Text, nullable=False),
    Column("findings", JSONDocument, nullable=False),
    Column("evidence_refs", JSONDocument, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    one_of("outcome", v.REPORT_OUTCOMES),
    Index(None, "task_id", "generation", "created_at"),
)

evidence = Table(
    "evidence",
    metadata,
    Column("evidence_id", String(ID), primary_key=True),
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("generation", Integer, nullable=False),
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("source", String(128), nullable=False),
    Column("queried_at", UTCDateTime, nullable=False),
    Column("content_ref", String(255), nullable=False),
    Column("origin", String(24), nullable=False),
    Column("truncated", Boolean, nullable=False),
    Column("summary", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # Host-recorded facts (migration 0006): what kind of tool, the parameters' digest, the
    # paged result's id, and the counts. Null on records written before them.
    Column("kind", String(24), nullable=True),
    Column("params_digest", String(64), nullable=True),
    Column("result_id", String(64), nullable=True),
    Column("row_count", Integer, nullable=True),
    Column("char_count", Integer, nullable=True),
    one_of("origin", v.EVIDENCE_ORIGINS),
    Index(None, "task_id", "generation"),
    Index(None, "task_id", "created_at", "evidence_id"),  # a task's records, a page at a time
)

actions = Table(
    "actions",
    metadata,
    Column("action_id", String(ID), primary_key=True),
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("generation", Integer, nullable=False),
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("node_id", String(NAME), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("payload", JSONDocument, nullable=False),
    Column("status", String(24), nullable=False),
    Column("decided_by", String(NAME_MAX), nullable=True),
    Column("decided_at", UTCDateTime, nullable=True),
    Column("note", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # What an approval is bound to (invariant 24): the plan revision the action was proposed
    # under and the SHA-256 of its kind and canonical payload.
    Column("plan_revision", Integer, nullable=True),
    Column("digest", String(64), nullable=False),
    one_of("kind", v.ACTION_KINDS),
    one_of("status", v.ACTION_STATUSES),
    CheckConstraint(
        "status = 'pending_approval' OR status = 'superseded' OR decided_by IS NOT NULL",
        name="decision_has_decider",
    ),
    Index(None, "status", "created_at"),
    Index(None, "created_at", "action_id"),  # every action, newest first (`any=true`)
    Index(None, "task_id", "generation"),
    Index(None, "task_id", "node_id"),  # a re-proposal finds the same digest for its node
    # A task's actions newest first, the list's keyset order: its decided actions' pages
    # (the task page's "Decided actions") walk it, where they read each action of the task.
    Index(None, "task_id", "created_at", "action_id"),
)

#: A pending action, with a literal: the predicate of the partial index below and the filter
#: of the query meant to use it (`store.task_versions` counts a task's pending actions at each
#: poll of its page, where the status index walked every pending action of the store).
PENDING_ACTION = actions.c.status == literal_column("'pending_approval'")
Index("ix_actions_pending_task_id", actions.c.task_id, postgresql_where=PENDING_ACTION,
      sqlite_where=PENDING_ACTION)  # fmt: skip

invocation_receipts = Table(
    "invocation_receipts",
    metadata,
    Column("invocation_id", String(ID), primary_key=True),
    Column("owner", String(128), nullable=False),
    # SET NULL, not CASCADE: `running` and `unknown` receipts outlive their session as orphans
    # (never deleted for age); the finished ones go with it (`ReceiptLedger.delete_session`).
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="SET NULL"),
        nullable=True,
    ),
    Column("tool_name", String(128), nullable=False),
    Column("identity_key", String(255), nullable=False),
    Column("args_digest", String(64), nullable=False),
    Column("claim_token", String(NAME), nullable=False),
    Column("status", String(16), nullable=False),
    Column("summary", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("owner", "identity_key"),
    one_of("status", v.RECEIPT_STATUSES),
    Index(None, "status", "updated_at"),
    Index(None, "session_id"),
)

#: A receipt still `running` or `unknown`, with the statuses as literals: the predicate of the
#: partial index below, and the filter of the queries meant to use it (a bound parameter would
#: not let the planner match the predicate).
unresolved_receipt = invocation_receipts.c.status.in_(
    [literal_column(f"'{status}'") for status in UNRESOLVED]
)

# Only unresolved receipts are looked up by content (an identical earlier write that must be
# verified first). Partial, so the index stays small, and a claim's read back by identity
# cannot pick it over the unique (owner, identity_key) one, which the planner of a table not
# yet analyzed did.
Index(
    None,
    invocation_receipts.c.owner,
    invocation_receipts.c.tool_name,
    invocation_receipts.c.args_digest,
    postgresql_where=unresolved_receipt,
    sqlite_where=unresolved_receipt,
)

collaboration_messages = Table(
    "collaboration_messages",
    metadata,
    Column("message_id", String(ID), primary_key=True),
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("role", String(8), nullable=False),
    Column("text", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # A client's `Idempotency-Key` and the SHA-256 of what it asked, on the question and its
    # answer: a retry returns them; a question is stored once per key (NULLs never collide).
    Column("idempotency_key", String(200), nullable=True),
    Column("request_digest", String(64), nullable=True),
    one_of("role", v.MESSAGE_ROLES),
    Index(None, "session_id", "created_at"),
    Index(None, "session_id", "idempotency_key", "role", unique=True),
)

recovery_snapshots = Table(
    "recovery_snapshots",
    metadata,
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("messages", JSONDocument, nullable=False),
    Column("receipts", JSONDocument, nullable=False),
    Column("unknown_calls", JSONDocument, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Why the round ended, its generation and its last plan (issue 12).
    Column("summary", JSONDocument, nullable=True),
)

#: The embedded lease back end: one row a lease name, fenced by its token.
leases = Table(
    "leases",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("token", String(NAME), nullable=False),
    Column("holder", String(255), nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("renewed_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Index(None, "expires_at"),
)

#: The durable transcript of an execution (issue 12): every model turn, written fenced before its
#: tool calls run, and every tool result as the envelope the model was shown (redacted). Goes with
#: its session. `parent_call_id` marks a sub-agent's entries under the call that started it.
transcript_entries = Table(
    "transcript_entries",
    metadata,
    Column(
        "session_id",
        String(ID),
        ForeignKey("sessions.session_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("seq", Integer, nullable=False),
    Column("task_id", String(ID), nullable=True),
    Column("generation", Integer, nullable=True),
    Column("turn", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("call_id", String(128), nullable=True),
    Column("parent_call_id", String(128), nullable=True),
    Column("tool_name", String(128), nullable=True),
    Column("status", String(16), nullable=True),
    Column("body", JSONDocument, nullable=False),
    Column("prompt_tokens", Integer, nullable=True),
    Column("completion_tokens", Integer, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("session_id", "seq"),
    one_of("kind", ("model_turn", "tool_result", "summary")),
    Index(None, "task_id", "generation", "seq"),
)

#: What must reach the business backend (DESIGN section 8, invariant 24). Event rows below are
#: the task's own ordered log (the task stream reads it); outbox rows are deliveries, each
#: written in the transaction of the change it reports (kinds and statuses: `vocabulary`).
#: Done with (`store.outbox.SETTLED`): delivered, or discarded by an operator.
OUTBOX_SETTLED = ("delivered", "discarded")

#: One task's events in commit order: `seq` is 1, 2, 3... per task, allocated under the task
#: row lock, so it is the order in which the changes committed (the stream's event id).
task_events = Table(
    "task_events",
    metadata,
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(32), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("data", JSONDocument, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("task_id", "seq"),
    CheckConstraint("seq >= 1", name="seq_positive"),
)

outbox = Table(
    "outbox",
    metadata,
    # 64 bits on Postgres (ids are never reused); SQLite's INTEGER PRIMARY KEY is 64 bits
    # already, and AUTOINCREMENT needs that exact type.
    Column(
        "outbox_id",
        BigInteger().with_variant(Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    Column("kind", String(16), nullable=False),
    Column("task_id", String(ID), ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("event_seq", Integer, nullable=True),
    Column("action_id", String(ID), nullable=True),
    Column("body", Text, nullable=False),  # the exact bytes sent (and signed)
    Column("status", String(16), nullable=False),
    # Claims so far: each claim adds one, and a claim's count is its compare-and-set token.
    Column("attempts", Integer, nullable=False, server_default="0"),
    # Of the attempts, those the backend answered 429: not counted toward a webhook's
    # ORCH_WEBHOOK_MAX_ATTEMPTS (a backend that says "later" is not failing).
    Column("throttled", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("delivered_at", UTCDateTime, nullable=True),
    # Who settled a dead letter by hand, when and why (migration 0021): kept with the row.
    # `discarded_by` and `retried_by` are wider than a name now is (NAME_MAX): they keep the
    # names of up to 200 characters a retry or discard took before the one limit.
    Column("discarded_at", UTCDateTime, nullable=True),
    Column("discarded_by", String(200), nullable=True),
    Column("discard_reason", Text, nullable=True),
    # What the row was when an operator discarded it (migration 0026): `dead`, or `pending`
    # (failing, and no dispatcher sending it: an action the backend answers 500 for every time
    # is retried for ever otherwise). Null: discarded before 0026, when only a dead one could be.
    Column("discarded_from", String(16), nullable=True),
    # An operator's last retry of the row (migration 0026): when, who, and their note (a
    # discard kept who, when and why; a retry kept nothing of it).
    Column("retried_at", UTCDateTime, nullable=True),
    Column("retried_by", String(200), nullable=True),
    Column("retry_note", Text, nullable=True),
    # When an operator's retry or discard last made the row deliverable again (migration 0024):
    # the retried row, and the pending webhooks of its task that it (or a discarded one) held
    # back. The oldest-pending gauge measures a row's wait from the later of this and
    # `created_at`: a retried dead letter's wait starts at the retry, not when it was written.
    Column("released_at", UTCDateTime, nullable=True),
    # Until when a dispatcher's claim holds the row to send it (migration 0025): set with the
    # hold at the claim and at each renewal, cleared when the answer is recorded or the claim
    # given back. A row is being sent while this is in the future: an operator's retry makes a
    # pending row due now only when it is not (a second dispatcher would send it meanwhile).
    Column("claimed_until", UTCDateTime, nullable=True),
    # When the dispatcher holding the claim posted its attempt (migration 0027): a batch's rows
    # are claimed together and posted one after another, so a claimed row without it waits its
    # turn in the batch, and only the one posted is being sent. Cleared with `claimed_until`.
    Column("sending_since", UTCDateTime, nullable=True),
    UniqueConstraint("action_id"),  # one delivery per approval
    one_of("kind", v.OUTBOX_KINDS),
    one_of("status", v.OUTBOX_STATUSES),
    CheckConstraint(
        "(kind = 'action' AND action_id IS NOT NULL) "
        "OR (kind = 'webhook' AND event_seq IS NOT NULL)",
        name="kind_reference",
    ),
    # `attempts - throttled` is what counts toward the limit: a throttled count above the
    # attempts (or below zero) would make a row undying or dead before its time.
    CheckConstraint("throttled >= 0 AND throttled <= attempts", name="throttled_within_attempts"),
    Index(None, "status", "next_attempt_at"),
    Index(None, "task_id", "kind", "event_seq"),
)

#: A pending row a dispatcher has tried (an attempt counted, or the error of before an
#: operator's retry), with literals: the predicate of the partial index below and the filter
#: of the query meant to use it (a bound parameter would not let the planner match it).
attempted_pending = and_(
    outbox.c.status == literal_column("'pending'"),
    or_(outbox.c.attempts > literal_column("0"), outbox.c.last_error.is_not(None)),
)

# Whether a dispatcher sends a kind is read from its rows (`store.outbox_views.kind_was_sent`): one
# delivered or dead, or one discarded that was tried (the status index), or one pending that was
# tried (`outbox_views.sent_lookups` repeats this predicate for an alias too). A store of
# 300,000 never attempted rows (a fleet without a webhook receiver) has none of the latter,
# which without this index was a walk through all of its pending rows at each look.
Index(None, outbox.c.kind, postgresql_where=attempted_pending, sqlite_where=attempted_pending)


def unsettled(table: FromClause) -> ColumnElement[bool]:
    """A row of `table` (the outbox, or an alias of it) not delivered nor discarded
    (`store.outbox.SETTLED`): still to send, or dead. With literals, as `attempted_pending`:
    the predicate of the partial index below, and the filter of the queries meant to use it."""
    return table.c.status.not_in([literal_column(f"'{status}'") for status in OUTBOX_SETTLED])


# What a task's webhooks wait behind is its earliest one not delivered or discarded
# (`outbox_sending.claim_due` checks it for each due row, `outbox_views.waits_behind` for each
# held one). A task keeps its delivered webhooks ORCH_RETENTION_DAYS, thousands for a busy one:
# the index on (task, kind, seq) walked them all at each look. This one holds only the rows
# still to send or dead, few per task.
Index(
    "ix_outbox_unsettled",
    outbox.c.task_id,
    outbox.c.kind,
    outbox.c.event_seq,
    postgresql_where=unsettled(outbox),
    sqlite_where=unsettled(outbox),
)


def settled(table: FromClause) -> ColumnElement[bool]:
    """A row of `table` delivered or discarded (`store.outbox.SETTLED`), with literals: the
    predicate of the partial index below and the filter of the query meant to use it."""
    return table.c.status.in_([literal_column(f"'{status}'") for status in OUTBOX_SETTLED])


# A task's view shows its delivered and discarded rows as counts per kind and status
# (`store.task_versions` reads them at each poll of an open task page): counted from this
# index alone (an index-only scan, no row read), where the other indexes of the task's rows
# made each poll read each of its thousands of delivered webhooks.
Index(
    "ix_outbox_settled",
    outbox.c.task_id,
    outbox.c.kind,
    outbox.c.status,
    postgresql_where=settled(outbox),
    sqlite_where=settled(outbox),
)

#: Console sessions signed out before their cookie expired (`orchestrator.api.signouts`): the
#: cookie's nonce, kept until that expiry, after which the cookie is refused anyway.
console_signouts = Table(
    "console_signouts",
    metadata,
    Column("nonce", String(64), primary_key=True),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("signed_out_at", UTCDateTime, nullable=False),
    # The session's account (null on rows of before 0020): its sign-outs are counted.
    Column("account", String(NAME_MAX), nullable=True),
    Index(None, "expires_at"),
    Index(None, "account"),
)

#: Per account, the sign-outs folded into one time once it had too many: its sessions
#: expiring no later than `before` (signed in no later than the one that folded them) are out.
console_account_signouts = Table(
    "console_account_signouts",
    metadata,
    Column("account", String(NAME_MAX), primary_key=True),
    Column("before", UTCDateTime, nullable=False),
)
