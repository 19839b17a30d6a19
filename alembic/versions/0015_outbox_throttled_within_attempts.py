"""outbox: the throttled attempts are some of the attempts (a CHECK)

`throttled` counts, of a row's attempts, those the backend answered 429, and `attempts -
throttled` is what counts toward ORCH_WEBHOOK_MAX_ATTEMPTS. Nothing in the database held
`0 <= throttled <= attempts`: a hand edit or a faulty write could leave a row whose counted
attempts are negative (never dead-lettered, retried for ever) or above the limit. The CHECK
`ck_outbox_throttled_within_attempts` refuses such a write. A row of before that breaks it (only
a hand edit makes one) is brought within bounds first, so the upgrade does not fail on it: a
negative count becomes 0, one above the attempts becomes the attempts (all of them throttled).

SQLite cannot add a constraint to a table, so the batch context recreates the table there.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_NAME = "ck_outbox_throttled_within_attempts"


def upgrade() -> None:
    op.execute(
        "UPDATE outbox SET throttled = CASE WHEN throttled < 0 THEN 0 ELSE attempts END"
        " WHERE throttled < 0 OR throttled > attempts"
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f(_NAME), "throttled >= 0 AND throttled <= attempts")


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_constraint(op.f(_NAME), type_="check")
