"""Alembic's entry point for nnhost's migrations; `nnhost.db.migrate` is the only caller.

The connection comes from the caller (``config.attributes["connection"]``),
already inside the transaction that holds the migration lock, so every
revision applied in one start commits together or not at all.
"""

from alembic import context

from nnhost.db.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
