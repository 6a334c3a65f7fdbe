"""The parent side of a replica: starting its host, handing it jobs, watching what comes back.

Runs in the controller's process (local replicas) or in a Ray actor. It
trusts nothing a job's process says (`job_watch`), and knows neither the
API nor the database.

May import: `execution`, `models`, and the top-level modules (`config`).
"""
