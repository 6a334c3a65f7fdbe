"""The job service as the API sees it: submitting, reading and cancelling jobs.

Runs in the API processes. `jobs` is the seam; in one process it calls the
controller's service directly, and across processes it goes through the
database (`database_link`).

May import: `jobs`, `auth`, `models`, `storage`, `db`.
"""
