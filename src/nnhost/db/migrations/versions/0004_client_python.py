"""Each job remembers the Python its client ran on.

A payload is a pickle written by the client's Python; a newer Python records
things in it (a dataclass's parameters, say) that the server's own may not
have. The job's process reads the payload knowing which Python wrote it, so
that what it translates or refuses names both Pythons.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.add_column(sa.Column("client_python", sa.Text, nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.drop_column("client_python")
