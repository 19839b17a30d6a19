"""outbox: `claimed_until`, until when a dispatcher's claim holds a row it is sending

An operator could retry only a dead row: a pending one failing against a backend that was down
waited out its backoff (up to ORCH_OUTBOX_BACKOFF_MAX_SECONDS) once the backend was mended.
Making a pending row due now is safe only when no dispatcher is sending it: a claimed row is
pending too, with its hold in `next_attempt_at`, as a row failed and backing off is, and a
retry that made a claimed row due would let a second dispatcher send it while the first still
waits for its answer. The claim now records its hold here (renewed with it) and the recorded
answer, or a release, clears it: a row is being sent while this is in the future. A claim an
older dispatcher holds has none: upgrade with the dispatchers (`sweeper`, `outbox dispatch`)
stopped, or retry a pending row once they all run this release.

Downgrade: the column goes; a pending row can no longer be retried safely (the old code does
not retry one).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("claimed_until")
