"""What separate API and controller processes share: payloads, the lease, commands, state.

A job's "may have started" moment moves from a file next to its payload into
the job's row (``started_at``), so a controller on another machine can tell
after a takeover whether a job may already have run.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Seconds: sa.Double[float] = sa.Double().with_variant(sa.REAL(), "sqlite")
Count = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.add_column(sa.Column("started_at", Seconds))
        table.add_column(sa.Column("priority", sa.Integer, nullable=False, server_default="0"))
    op.create_table(
        "job_payloads",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("acquired_at", Seconds, nullable=False),
        sa.Column("expires_at", Seconds, nullable=False),
    )
    op.create_table(
        "shared_values",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated_at", Seconds, nullable=False),
    )
    op.create_table(
        "commands",
        sa.Column("id", Count, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("args", sa.Text, nullable=False, server_default="{}"),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("done_at", Seconds),
        sa.Column("result", sa.Text),
    )
    op.create_index("commands_pending", "commands", ["done_at"])


def downgrade() -> None:
    op.drop_index("commands_pending", "commands")
    for name in ("commands", "shared_values", "leases", "job_payloads"):
        op.drop_table(name)
    with op.batch_alter_table("jobs") as table:
        table.drop_column("priority")
        table.drop_column("started_at")
