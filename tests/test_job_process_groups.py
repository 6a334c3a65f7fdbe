"""Putting a new job process into its cgroup never holds up a job that is finishing.

Moving a process into a group waits for the kernel: about 12 ms on this
machine, and longer on a busy one. The replica's next job process arrives
while the current job runs, so a move made under the replica's lock made the
finishing job's reader (which takes that lock to free the replica before it
reports) wait for it, and the client's COMPLETED with it. Here the move is
held until the test lets it go; the lock must be free all the while, and the
new process's reader must not start before its group is set.
"""

from __future__ import annotations

import socket
import threading

from fakes import BareReplicaSide

from nnhost.execution.messages import Slot as SlotMessage
from nnhost.execution.policy import WorkerPolicy
from nnhost.replicas.slots import JobProcesses


class HeldGroups:
    """Cgroups whose move waits until the test says so."""

    available = True
    problem = None

    def __init__(self) -> None:
        self.moving = threading.Event()
        self.let_go = threading.Event()
        self.attached: list[int] = []

    def attach(self, pid: int, memory_bytes: int, tasks: int) -> None:
        self.moving.set()
        assert self.let_go.wait(30), "the test never let the move finish"
        self.attached.append(pid)


def test_the_replica_lock_is_free_while_a_new_process_moves_into_its_group():
    groups = HeldGroups()
    lock = threading.RLock()
    jobs = JobProcesses("org/a", WorkerPolicy(), lock, BareReplicaSide(groups),
                        on_job_event=lambda event: None, on_idle=lambda: None, on_incident=lambda kind: None)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    adding = threading.Thread(target=jobs.add, args=(SlotMessage(pid=4321, reusable=False), [ours.detach()], 1))
    adding.start()
    try:
        assert groups.moving.wait(30)
        # Another thread (a finishing job's reader) takes the lock meanwhile.
        taken = threading.Event()

        def finishing_reader() -> None:
            with lock:
                taken.set()

        reader = threading.Thread(target=finishing_reader)
        reader.start()
        assert taken.wait(10), "the replica's lock was held while the process moved into its group"
        reader.join()
        assert 4321 in jobs.slots and groups.attached == []
    finally:
        groups.let_go.set()
        adding.join(30)
        theirs.close()
    assert groups.attached == [4321]
