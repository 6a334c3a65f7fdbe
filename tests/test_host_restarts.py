"""A replica whose host died starts another; when the machine refuses one, it says why and tries again.

The host here is a fake (a channel end the test speaks for), so that the
test can make the one thing under test fail: starting the next host. The
real restart of a killed template runs in `test_execution_designs`.
"""

from __future__ import annotations

import errno
import logging
import threading
import time

from nnhost.execution.channel import Channel, pair
from nnhost.execution.messages import TO_HOST, Fork, Options, State
from nnhost.execution.policy import WorkerOptions
from nnhost.replicas import replica as replica_module
from nnhost.replicas.contract import ReplicaState, ReplicaStatus


class FakeHost:
    """What the replica asks of a host's ``Popen``: it lives until the test closes its channel."""

    pid = 4242
    returncode = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = -9
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


def serve_until_running(side: Channel) -> None:
    """Play a host: take the options, say RUNNING, take the first fork request."""
    message, _ = TO_HOST.receive(side)
    assert isinstance(message, Options), message
    side.send(State(state="RUNNING", description="Loaded."))
    message, _ = TO_HOST.receive(side)
    assert isinstance(message, Fork), message


class Spares:
    """The spare pool, handing out the test's hosts in order (None: no spare is ready)."""

    def __init__(self, hosts: list) -> None:
        self.hosts = list(hosts)

    def take(self, env, environ):
        return self.hosts.pop(0) if self.hosts else None

    def keep(self, env, environ, count) -> None:
        pass


def restart_after_death(monkeypatch, hosts: list, first_side, second_side) -> list[ReplicaState]:
    """Start a replica on ``hosts[0]``, end that host, serve the host it restarts on; every state it said."""
    monkeypatch.setattr(replica_module, "SPARES", Spares(hosts))
    states: list[ReplicaState] = []
    restarted = threading.Event()

    def on_state(state: ReplicaState) -> None:
        states.append(state)
        if sum(s.state is ReplicaStatus.RUNNING for s in states) >= 2:
            restarted.set()  # the first host's RUNNING, then its successor's

    replica = replica_module.LocalReplica(
        "org/a", WorkerOptions(model_key="org/a"), on_job_event=lambda event: None,
        on_state=on_state, on_idle=lambda: None, restart_delay=0.05,
    )
    second_side.settimeout(30)  # a replica that never tries again fails the test, not hangs it
    replica.start()
    try:
        serve_until_running(Channel(first_side))
        first_side.close()  # the host dies
        serve_until_running(Channel(second_side))
        assert restarted.wait(30), [state.description for state in states]
    finally:
        replica.stop()
        second_side.close()
    return states


def test_a_host_that_cannot_be_started_again_is_retried_and_says_why(monkeypatch, caplog):
    first, first_side = pair()
    second, second_side = pair()
    refusals = []

    def start_host(env, environ):
        refusals.append(time.monotonic())
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(replica_module, "start_host", start_host)
    caplog.set_level(logging.ERROR, logger="nnhost.replica")
    # The next start is refused once; the try after it takes the second host.
    states = restart_after_death(
        monkeypatch, [(FakeHost(), Channel(first)), None, (FakeHost(), Channel(second))], first_side, second_side,
    )
    said = [state.description for state in states if "could not be started again" in state.description]
    assert said and "Resource temporarily unavailable" in said[0], [s.description for s in states]
    assert any("could not be started again" in record.getMessage() for record in caplog.records)
    assert len(refusals) == 1


def test_a_spare_that_died_before_its_model_was_named_is_passed_over(monkeypatch):
    """A prepared spare killed while it waited (the OOM killer, say): the send to it fails, and the next is taken.

    This is what stopped every restart before: the failed send ended the
    watchdog's thread, so no host was ever started again.
    """
    first, first_side = pair()
    dead, dead_side = pair()
    dead_side.close()
    second, second_side = pair()
    spare = FakeHost()
    states = restart_after_death(
        monkeypatch, [(FakeHost(), Channel(first)), (spare, Channel(dead)), (FakeHost(), Channel(second))],
        first_side, second_side,
    )
    assert spare.returncode is not None  # the dead spare was reaped, not left behind
    assert any("could not be started again" in state.description for state in states)
