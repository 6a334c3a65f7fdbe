"""LOG lines get an id, so they read back in the order they were written on any database.

Before, the order was SQLite's hidden rowid, which PostgreSQL has no equivalent
of. On SQLite the rows keep their rowid as the new id, so the order of lines
already stored is exactly what it was.

Revision ID: 0002
Revises: 0001
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Seconds: sa.Double[float] = sa.Double().with_variant(sa.REAL(), "sqlite")


def _rebuild(with_id: bool) -> None:
    columns: list[sa.Column[Any]] = [
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("at", Seconds, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
    ]
    if with_id:
        key = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
        columns.insert(0, sa.Column("id", key, primary_key=True, autoincrement=True))
    op.create_table("job_logs_next", *columns)
    sqlite = op.get_bind().dialect.name == "sqlite"
    if with_id and sqlite:
        op.execute(
            "INSERT INTO job_logs_next (id, job_id, at, line)"
            " SELECT rowid, job_id, at, line FROM job_logs"
        )
    else:
        order = "id" if not with_id else ("rowid" if sqlite else "at")
        op.execute(
            "INSERT INTO job_logs_next (job_id, at, line)"
            f" SELECT job_id, at, line FROM job_logs ORDER BY {order}"
        )
    op.drop_index("job_logs_by_job", "job_logs")
    op.drop_index("job_logs_by_time", "job_logs")
    op.drop_table("job_logs")
    op.rename_table("job_logs_next", "job_logs")
    op.create_index("job_logs_by_job", "job_logs", ["job_id"])
    op.create_index("job_logs_by_time", "job_logs", ["at"])


def upgrade() -> None:
    _rebuild(with_id=True)


def downgrade() -> None:
    _rebuild(with_id=False)
