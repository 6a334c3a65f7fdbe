"""Where payloads and results live: a directory or an S3-compatible store, and signed links.

Runs wherever a payload or result is read or written: the API (links,
downloads), the controller (storing results) and the database link.

May import: `db`, and the vocabulary of `execution` (`execution.events`).
"""
