"""Accounts, API keys, sessions and the limits each account is held to.

Runs in the API processes (checking keys and sessions) and the CLI (making
accounts); it keeps its records through the one database layer.

May import: `db`, and the top-level modules (`config`, `units`).
"""
