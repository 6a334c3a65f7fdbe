"""A pool of real nnsight client processes for measuring throughput.

Throughput is what many users see at once, so it is measured with many
clients: separate processes (not threads, which would share one interpreter
lock), each running the unmodified nnsight client the way a user does, a
blocking ``model.trace(..., backend=RemoteBackend(...))`` through the
websocket. Starting a process and importing nnsight costs seconds of CPU, so
the processes are started once, before anything is timed, and reused for every
server and client count; between rounds they wait on their pipe.

A round: the parent names a server, a start time and a length; each chosen
client runs traces back to back from the start time and counts those that
finished, with a correct result, before the end. Jobs in flight at the end
are not counted, the same for every server. Each client also reports the CPU
its own process used in the round: with the clients on the server's cores,
that sets a ceiling no server can pass (`ClientPool.client_cpu_per_job`).
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
import warnings
from typing import Optional, Sequence

PROMPT = "The Eiffel Tower is in the city of"


def _trace(model, backend):
    with model.trace(PROMPT, backend=backend):
        logits = model.lm_head.output[:, -1].save()
    return logits


def _client(connection, repo: str) -> None:
    """One client process: load the client once, then serve rounds until told to stop."""
    try:
        import nnsight
        from nnsight import LanguageModel
        from nnsight.intervention.backends.remote import RemoteBackend

        nnsight.CONFIG.APP.REMOTE_LOGGING = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = LanguageModel(repo)
        connection.send(("ready", None))
    except BaseException:  # noqa: BLE001 - the parent reports it
        connection.send(("failed", traceback.format_exc()))
        return
    while True:
        order = connection.recv()
        if order is None:
            return
        url, start_at, seconds, expected, key = order
        done, error, cpu = 0, None, 0.0
        try:
            while time.time() < start_at:
                time.sleep(0.001)
            cpu = time.process_time()
            end = start_at + seconds
            while time.time() < end:
                logits = _trace(model, RemoteBackend(model.to_model_key(), host=url, api_key=key))
                if time.time() > end:
                    break
                if expected is not None and not _close(logits, expected):
                    error = "a remote result differed from the local one"
                    break
                done += 1
        except BaseException:  # noqa: BLE001
            error = traceback.format_exc()
        connection.send(("done", (done, error, time.process_time() - cpu)))


def _close(value, expected) -> bool:
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.shape == expected.shape
        and bool(torch.allclose(value, expected, rtol=1e-5, atol=1e-6))
    )


class ClientPool:
    """``size`` client processes of ``repo``, started and loaded before any timing."""

    def __init__(self, size: int, repo: str, timeout: float = 600.0) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes = []
        self._processes = []
        for _ in range(size):
            parent, child = context.Pipe()
            process = context.Process(target=_client, args=(child, repo), daemon=True)
            process.start()
            self._pipes.append(parent)
            self._processes.append(process)
        #: CPU seconds the clients' own processes spent per finished job in the last
        #: round (every thread of each: nnsight's websocket threads too).
        self.client_cpu_per_job = 0.0
        for pipe in self._pipes:
            if not pipe.poll(timeout):
                raise RuntimeError("a client process did not load nnsight in time")
            kind, detail = pipe.recv()
            if kind != "ready":
                raise RuntimeError(f"a client process failed to start:\n{detail}")

    def rate(self, url: str, clients: int, seconds: float, expected=None,
             keys: Optional[Sequence[str]] = None) -> float:
        """Jobs per second that ``clients`` processes complete against ``url`` in ``seconds``.

        ``keys``: one API key per client (several users); None: the one the
        client's configuration names, for all of them (one user).
        """
        if clients > len(self._pipes):
            raise ValueError(f"the pool has {len(self._pipes)} clients, not {clients}")
        if keys is not None and len(keys) < clients:
            raise ValueError(f"{len(keys)} keys for {clients} clients")
        start_at = time.time() + 0.5
        chosen = self._pipes[:clients]
        for n, pipe in enumerate(chosen):
            pipe.send((url, start_at, seconds, expected, keys[n] if keys is not None else None))
        total, errors, cpu = 0, [], 0.0
        for pipe in chosen:
            if not pipe.poll(seconds + 300):
                raise RuntimeError("a client process did not report back")
            _, (done, error, used) = pipe.recv()
            total += done
            cpu += used
            if error:
                errors.append(error)
        if errors:
            raise RuntimeError(f"{len(errors)} clients failed; the first:\n{errors[0]}")
        self.client_cpu_per_job = cpu / total if total else 0.0
        return total / seconds

    def close(self, timeout: Optional[float] = 10.0) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout)
            if process.is_alive():
                process.kill()
