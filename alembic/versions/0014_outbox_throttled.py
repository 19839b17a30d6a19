"""outbox: the attempts the backend throttled (HTTP 429), counted apart

A healthy business backend that rate-limits a burst answers `429 Too Many Requests` ("later"),
and every such answer used to spend one of a webhook's ORCH_WEBHOOK_MAX_ATTEMPTS: a burst of a
few minutes dead-lettered webhooks and stopped their tasks' event streams until an operator
retried them. `outbox.throttled` counts, of a row's attempts, those answered 429; a webhook is
dead-lettered when its attempts that were not throttled reach the limit. `attempts` is left as
it is (a claim's compare-and-set token, which must never go backwards). Existing rows: none of
their attempts throttled, as they were counted before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("throttled", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("throttled")
