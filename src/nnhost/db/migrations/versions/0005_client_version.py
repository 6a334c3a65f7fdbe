"""Each job remembers the nnsight version that serves it.

A client of another nnsight version than the server's own is served by that
version's runtime (`nnhost.runtimes`): the job's row says which, so that a
job taken over after a restart runs with the same code it was accepted for.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.add_column(sa.Column("client_version", sa.Text, nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.drop_column("client_version")
