"""What putting a process back after a job came to: what was undone, and what could not be.

A module of its own because every part of the guard (`integrity`,
`attribute_snapshots`, `process_state`) fills one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GuardReport:
    """What a job left changed, and whether the worker must be restarted."""

    restored: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.fatal:
            parts.append("could not be undone: " + "; ".join(self.fatal[:5]))
        if self.restored:
            parts.append("undone: " + "; ".join(self.restored[:5]))
        return " ".join(parts)
