"""The schema nnhost had before it had migrations, adopted where it is already there.

Before versioned migrations each store ran ``CREATE TABLE IF NOT EXISTS`` on
start, so a data directory may hold all of these tables, some of them (``nnhost
users add`` before the first ``serve`` made only users and keys), or none; and
databases older still lack ``users.password_hash``. This revision brings any
of those to the same schema without touching a row: tables and indexes only
where missing, the column only where absent.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Seconds: sa.Double[float] = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("user_id", sa.Integer, nullable=False),
        sa.Column("model_key", sa.Text, nullable=False),
        sa.Column("deployment", sa.Text, nullable=False),
        sa.Column("session_id", sa.Text, nullable=False, server_default=""),
        sa.Column("compress", sa.Integer, nullable=False, server_default="0"),
        sa.Column("env", sa.Text, nullable=False, server_default="{}"),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("meta", sa.Text),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("updated_at", Seconds, nullable=False),
        sa.Column("base_url", sa.Text, nullable=False, server_default=""),
        sa.Column("result_size", sa.BigInteger().with_variant(sa.Integer(), "sqlite")),
        sa.Column("result_expires_at", Seconds),
        if_not_exists=True,
    )
    op.create_index("jobs_by_status", "jobs", ["status"], if_not_exists=True)
    op.create_index("jobs_by_user", "jobs", ["user_id", "created_at"], if_not_exists=True)
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("at", Seconds, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        if_not_exists=True,
    )
    op.create_index("job_logs_by_job", "job_logs", ["job_id"], if_not_exists=True)
    op.create_index("job_logs_by_time", "job_logs", ["at"], if_not_exists=True)

    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("email", sa.Text, nullable=False, unique=True),
        sa.Column("tags", sa.Text, nullable=False, server_default="[]"),
        sa.Column("disabled", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("password_hash", sa.Text),
        sqlite_autoincrement=True,
        if_not_exists=True,
    )
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("users")}
    if "password_hash" not in columns:
        op.add_column("users", sa.Column("password_hash", sa.Text))
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("expires_at", Seconds),
        sa.Column("revoked_at", Seconds),
        sa.Column("last_used_at", Seconds),
        sqlite_autoincrement=True,
        if_not_exists=True,
    )
    op.create_index("api_keys_by_user", "api_keys", ["user_id"], if_not_exists=True)
    op.create_table(
        "web_sessions",
        sa.Column("hash", sa.Text, primary_key=True),
        sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("expires_at", Seconds, nullable=False),
        if_not_exists=True,
    )
    op.create_index("web_sessions_by_user", "web_sessions", ["user_id"], if_not_exists=True)
    op.create_table(
        "invites",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hash", sa.Text, nullable=False, unique=True),
        sa.Column("prefix", sa.Text, nullable=False),
        sa.Column("tags", sa.Text, nullable=False, server_default="[]"),
        sa.Column("note", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", Seconds, nullable=False),
        sa.Column("expires_at", Seconds),
        sa.Column("used_at", Seconds),
        sa.Column("used_by", sa.Integer, sa.ForeignKey("users.id")),
        sqlite_autoincrement=True,
        if_not_exists=True,
    )


def downgrade() -> None:
    for table in ("invites", "web_sessions", "api_keys", "users", "job_logs", "jobs"):
        op.drop_table(table)
