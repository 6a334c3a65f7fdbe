"""What can go wrong with the database before serving, as sentences for the operator."""


class DatabaseError(RuntimeError):
    """The database cannot be used; the message says which and what to do."""
