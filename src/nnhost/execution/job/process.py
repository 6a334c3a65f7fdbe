"""One job's process: forked ahead of time, contained, runs one user's jobs, exits.

The host (`host`, the fork design) or the template (`template`, the mapped
design) forks this process before any job is waiting for it, so the fork and
the containment set-up are off the request's path. Here, still root and
before anything of a job has been read, it:

1. points its stdout and stderr (descriptors 1 and 2, so native writes and
   Python warnings too) at a pipe whose other end the replica reads as this
   job's LOG stream, and closes every other descriptor but its own channel
   (and, in the mapped design, the weights' handles until they are bound);
2. adds the per-job layers (`job_layers`): PID 1 of its own PID namespace, its
   own mount namespace with a fresh ``/tmp`` and ``/proc``, its own network
   and IPC namespaces, limits, and a uid of its own. In the mapped design it
   binds the host's weights into its copy of the model's tree
   (`weights.mapped`) half-way, once its own ``/proc`` is mounted (a GPU's
   driver starts nowhere else) and before its limits and identity;
3. says it is ready (`messages.Ready`) and waits for its job
   (`messages.Run`), warming up first if the replica says so (`messages.Warm`:
   its running job has ended, and no other waits).

Then it runs that job with the `Runner` (the Python layer as before), reports
RUNNING, LOG and one final event. The model it sees is the host's,
copy-on-write, with the weights in read-only memory. A cheap comparison of
torch's global state says in the final message what the job changed.

If the replica said it may stay (``Run.stay_within``: the job's owner may send more,
`replicas.slots`), it puts back what the job changed on the model once the
result is out (`integrity.ModelGuard`, its snapshot taken before any job),
says it is ready again, and is parked (stopped) until that same user's next
job; if the job changed what cannot be put back, it exits instead. Otherwise
it exits, and the replica kills what is left.

It never runs another user's job and never learns anything of another user's.
"""

from __future__ import annotations

import io
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from ..channel import Channel
from ..events import JobEvent, JobSpec, cut_description
from ..handoff import receive_job
from ..messages import TO_SPARE, Event, Ready, Warm

if TYPE_CHECKING:
    from ..guard.integrity import ModelGuard
    from ..policy import WorkerOptions, WorkerPolicy
    from .runner import Runner

#: Marks a payload that carries raw Python first (tests only; see `TEST_HOOK`).
TEST_MAGIC = b"NNHOST-TEST-RAW-PYTHON\n"
TEST_SEPARATOR = b"\n#NNHOST-END-OF-RAW-PYTHON\n"


def live(
    sock: Any,
    log_fd: int,
    runner: Runner,
    policy: WorkerPolicy,
    options: WorkerOptions,
    memory_cgroup: bool,
    weights: Optional[list[int]] = None,
    warm: bool = True,
) -> None:
    """The whole life of a job process (called in the child right after fork; never returns).

    ``warm``: run a request of our own before saying ready, so that the job
    finds its pages copied and torch's threads started. It costs a whole
    request's CPU, which only pays while nobody waits: the replica asks for
    it for the first process of a host no job waits for (`replicas.replica`).
    A process forked while a job runs says it is ready at once and warms up
    only if told to (`messages.Warm`) once that job has ended (`replicas.slots`):
    warming up beside it took the CPU the running job needed.

    ``weights``: in the mapped design, the handles of the host's weights, bound
    into this process's module tree while it takes its layers (`weights.mapped`).
    """
    status = 0
    channel = Channel(sock)
    try:
        _detach_from_host(sock.fileno(), log_fd, weights or [])
        from ..os_layer.job_layers import contain_job, host_pid

        settle = None
        if weights is not None:
            from ..weights.mapped import bind

            def settle() -> None:
                bind(runner.model, weights)
                for fd in weights:  # mapped now: the mappings hold what they need
                    os.close(fd)

        uid = policy.limits.uid_base + host_pid()
        runner.sole_job = True  # fresh memory: see `fresh_memory.blanking_needed`
        report = contain_job(policy.limits, uid, memory_cgroup, settle)
        import torch

        # The host never starts torch's thread pool (a pool started before
        # fork would hang here); each job process starts its own.
        torch.set_num_threads(options.torch_threads if options.torch_threads > 0 else (os.cpu_count() or 1))
        if warm:
            _warm_up(runner)
        else:
            _settle()
        from .memory_meter import prepare, resident_bytes

        prepare()  # its thread started now, not on the job's path
        guard = _owner_guard(runner, options)
        settled = resident_bytes()
        channel.send(Ready(containment=report.to_dict()))
        while True:
            message, fds = TO_SPARE.receive(channel)
            if message is None:
                os._exit(0)
            if isinstance(message, Warm):
                # The replica's job has ended, and none waited for us when we
                # were asked for. One may have come since: it goes first.
                if not select.select([channel.sock], [], [], 0)[0]:
                    _warm_up(runner)
                continue
            spec = receive_job(message, fds)
            if policy.test_hooks:
                try:
                    _run_test_hook(spec, channel, runner)
                except Exception:
                    channel.send(Event(job_id=spec.job_id, status="ERROR",
                                       description="test hook: " + traceback.format_exc()[-8000:]))
                    os._exit(0)
            run_one(spec, runner, channel)
            if not (message.stay_within and _as_found(guard, message.stay_within, settled)):
                break
            # Its owner's next job may come here: say so, and be parked
            # (stopped) by the host until it does.
            channel.send(Ready())
        _step_aside()
    except BaseException:
        status = 3
        try:
            os.write(2, traceback.format_exc().encode()[-4000:])
        except OSError:
            pass
    finally:
        os._exit(status)


def _owner_guard(runner: Runner, options: WorkerOptions) -> Optional[ModelGuard]:
    """The guard that lets this process run its owner's next job, or None if it runs one.

    The fork design's host took the model's snapshot before forking us; the
    mapped design's template has no weights to snapshot, so the snapshot is
    taken here, once they are bound. Either way what is this process's own
    (its threads, torch's thread count) is taken now, as the job will find it.
    """
    if not may_stay(runner, options):
        return None
    from ..guard.integrity import ModelGuard

    guard = runner.owner_guard
    if guard is None:
        guard = ModelGuard(runner.model, runner.persistent_objects, weights_sealed=True)
    guard.adopt()
    return guard


def may_stay(runner: Runner, options: WorkerOptions) -> bool:
    """A job's process of this host may run its owner's next jobs (contained, and allowed to)."""
    return options.jobs_per_process > 1 and runner.unpickler is not None


def _as_found(guard: Optional[ModelGuard], most_bytes: int, settled: int) -> bool:
    """After a job's result is out: put back what it changed; False if that cannot be done.

    Or if, after a collection, this process holds more than ``most_bytes``
    beyond the ``settled`` resident size it had when it first said it was
    ready: the host would kill it when it is parked (`parked`), and its
    owner's next job might already be on its way to it. This count is its
    own and cheap; the host's, when it parks it, is the kernel's.

    Runs in the job's own process, after the job's code: it keeps an honest
    user's next request as a fresh process would find the model. What it
    cannot check is what beaten Python hides, and that reaches only the same
    user's later jobs: another user's never run here (`replicas.slots`), and
    nothing runs while parked (`messages.Park`).
    """
    if guard is None:
        return False
    import gc

    try:
        report = guard.restore()
    except Exception:
        return False
    # What the job freed stays in this process's heap for its next job (handing
    # it back to the kernel made that job fault it in again, on its path),
    # unless that is too much to keep.
    gc.collect()
    if report.fatal:
        return False
    from .memory_meter import resident_bytes

    if resident_bytes() - settled <= most_bytes:
        return True
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return resident_bytes() - settled <= most_bytes


def _step_aside() -> None:
    """Lower every thread of this process to the least priority: its result is out.

    What is left is its exit, and unmapping its copy of the host's address
    space is milliseconds of the kernel's time, spent in this process. It must
    not take the CPU from the server telling the client, nor from the next
    job. Raising one's own nice value needs no privilege.
    """
    try:
        tasks = [int(task) for task in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        tasks = [0]
    for task in tasks:
        try:
            os.setpriority(os.PRIO_PROCESS, task, 19)
        except OSError:
            pass


def _warm_up(runner: Runner) -> None:
    """While no job waits for us: touch what a job touches (the pages it would
    copy from the host, torch's thread pool), off the request's path."""
    from .warm_up import warm_up

    warm_up(runner.model, runner)
    _settle()


def _settle() -> None:
    import gc

    # What was made so far (a warm-up, and in the mapped design the tree's
    # weights, bound here) stays for the job: no collection walks it again.
    gc.collect()
    gc.freeze()


def _detach_from_host(channel_fd: int, log_fd: int, weights: list[int]) -> None:
    """Keep nothing of the host's: only the channel, the log pipe as 1 and 2, /dev/null as 0.

    And the weights' descriptors (mapped design) until they are bound.
    """
    import ctypes

    from ..os_layer.libc import PR_SET_PDEATHSIG, c_library

    c_library().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    keep = sorted({0, 1, 2, channel_fd, *weights})
    start = 3
    for fd in keep[3:] + [os.sysconf("SC_OPEN_MAX")]:
        os.closerange(start, fd)
        start = fd + 1
    os.set_inheritable(channel_fd, False)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="replace")
    sys.argv = [sys.argv[0]] if sys.argv else []
    del ctypes


def run_one(spec: JobSpec, runner: Runner, channel: Channel) -> None:
    """Run the job, stream its events, hold back the final one until the output is flushed."""
    from ..guard.process_state import shared_state, shared_state_changes

    checked = time.perf_counter()
    before = shared_state()
    check_seconds = time.perf_counter() - checked
    final: list[JobEvent] = []

    def emit(event: JobEvent) -> None:
        if event.final:
            final.append(event)  # cut once its notice is added
        else:
            channel.send(Event.of(replace(event, description=cut_description(event.description))))

    runner.run(spec, emit)
    checked = time.perf_counter()
    changes = shared_state_changes(before)
    check_seconds += time.perf_counter() - checked
    notice = ""
    if changes:
        notice = (
            f" Your request changed state shared by its process ({', '.join(changes[:4])}); "
            "no other user's request sees the change, and your next one starts without it."
        )
    _flush_output()
    for event in final[:1]:
        # A traceback of a deep recursion, say, is cut to what every layer accepts.
        meta = event.meta
        if isinstance(meta, dict):
            # What the per-job check of shared state cost (benchmarks read it).
            meta = {**meta, "integrity_seconds": round(check_seconds, 6)}
        channel.send(Event.of(replace(event, description=cut_description(event.description, notice),
                                      meta=meta)))


def _flush_output() -> None:
    """Everything written to stdout/stderr reaches the LOG pipe before the final event."""
    # ``sys.__stdout__`` may be None: its AttributeError is passed over like any other.
    streams: tuple[Any, ...] = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    for stream in streams:
        try:
            stream.flush()
        except Exception:
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _run_test_hook(spec: JobSpec, channel: Channel, runner: Runner) -> None:
    """TEST_HOOK: run a payload's raw Python prefix unrestricted, as if the sandbox were beaten.

    Only a server started with the ``unsafe_test_hooks`` setting (an operator
    setting; nothing in a request can turn it on) looks at this prefix. The
    rest of the payload is then run as the normal request it is.
    """
    with os.fdopen(os.dup(spec.payload_fd), "rb") as file:
        blob = file.read()
    os.lseek(spec.payload_fd, 0, os.SEEK_SET)  # the dup shared the offset
    if not blob.startswith(TEST_MAGIC) or TEST_SEPARATOR not in blob:
        return
    source, _, rest = blob[len(TEST_MAGIC):].partition(TEST_SEPARATOR)
    replacement = os.memfd_create("payload", os.MFD_CLOEXEC)
    os.write(replacement, rest)
    os.lseek(replacement, 0, os.SEEK_SET)
    os.close(spec.payload_fd)
    spec.payload_fd = replacement
    namespace: dict[str, Any] = {"channel": channel, "spec": spec, "model": runner.model, "runner": runner}
    exec(compile(source.decode(), "<test hook>", "exec"), namespace)  # noqa: S102 (tests only)


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
