"""What every tier shares about a job: its record, its status, its updates and the bus.

Leaf types and the event bus, imported by the API, the front and the
controller alike; no process of its own.

May import: `db`, and the vocabulary of `execution` (`execution.events`).
"""
