"""The process tree under a test's server, read from /proc: which process is which, who maps the weights.

Tests of the execution designs look at the real processes (hosts, templates,
job processes) rather than at what the server says about them.
"""

from __future__ import annotations

import os


def processes() -> dict[int, tuple[int, str]]:
    """Every process: its parent and command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry)] = (parent, command)
    return found


def descendants(pid: int, table) -> list[int]:
    out, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, (parent, _) in table.items() if parent == current]
        out += children
        frontier += children
    return out


def serving_hosts(table, tree: list[int]) -> list[int]:
    """Host processes holding a model (a spare host, prepared for the next one, holds none)."""
    hosts = []
    for pid in tree:
        if "nnhost.execution.host.host" in table[pid][1]:
            try:
                if maps_weights(pid):
                    hosts.append(pid)
            except OSError:
                pass
    return hosts


def templates_of(table, hosts: list[int]) -> list[int]:
    """Template processes: the hosts' children (a job's process, its fork, shares its command line)."""
    return [p for p, (parent, command) in table.items()
            if parent in hosts and "nnhost.execution.host.template" in command]


def maps_weights(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as file:
        return "nnhost-weights" in file.read()


def start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot): with the pid, a process's identity, as pids are reused."""
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[19])
