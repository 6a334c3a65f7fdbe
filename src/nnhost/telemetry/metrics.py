"""Prometheus metrics for ``/metrics``, with the official ``prometheus_client``.

Two kinds of numbers. Events are counted as they happen: `JobMetrics` is a
`jobs.observer.JobObserver` (received and finished jobs by model and final
status, time waiting for a replica, time running, result sizes), and the API
middleware counts HTTP responses. State is read when Prometheus scrapes:
`_StateCollector` reads the controller's board (`controller.board`: queue
lengths, levels, replica states, memory per device and the incident tallies,
i.e. worker restarts and containment faults), live in its own process and as
last published on an API process. Scrapes happen on the event loop, the same
thread that changes that state, so a scrape sees one consistent moment.

The registry is this server's own, not the library's global one: the numbers
describe this process since it started, as Prometheus expects of counters, and
two servers in one test process never mix. No label holds a user's data (no
job ids, emails or keys), so cardinality stays bounded by the catalog.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from ..jobs.job import Job, Status
from ..jobs.messages import Board
from ..replicas.contract import Level
from ..replicas.incidents import Incident
from .recent import RecentJobs

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

#: Seconds: from a small trace's tens of milliseconds to the default hour's limit.
TIME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Bytes: powers of four from 1 KiB to 4 GiB.
SIZE_BUCKETS = tuple(float(1024 * 4**n) for n in range(12))


class JobMetrics:
    """Counts the job lifecycle as the job service records it."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str]) -> None:
        #: The last hour, for the status page.
        self.recent = RecentJobs()
        self.received = Counter(
            "nnhost_jobs_received", "Requests accepted, by model.", ["model"], registry=registry
        )
        self.finished = Counter(
            "nnhost_jobs_finished", "Requests that ended, by model and final status.",
            ["model", "status"], registry=registry,
        )
        self.wait = Histogram(
            "nnhost_queue_wait_seconds", "From acceptance to being handed to a replica.",
            ["model"], buckets=TIME_BUCKETS, registry=registry,
        )
        self.run = Histogram(
            "nnhost_job_run_seconds", "From RUNNING to the final status, as the server saw it.",
            ["model"], buckets=TIME_BUCKETS, registry=registry,
        )
        self.result = Histogram(
            "nnhost_result_bytes", "Size of each completed request's result.",
            ["model"], buckets=SIZE_BUCKETS, registry=registry,
        )
        for model in models:
            # Every series exists from the start at 0, so a rate is right from the first job.
            self.received.labels(model)
            self.wait.labels(model)
            self.run.labels(model)
            self.result.labels(model)
            for status in (status for status in Status if status.final):
                self.finished.labels(model, status.value)
        self._running_since: dict[str, float] = {}
        self._waited: dict[str, float] = {}

    def job_changed(self, job: Job) -> None:
        model, status = job.deployment, job.status
        if status is Status.RECEIVED:
            self.received.labels(model).inc()
        elif status is Status.DISPATCHED:
            waited = max(0.0, time.time() - job.created_at)
            self._waited[job.id] = waited
            self.wait.labels(model).observe(waited)
        elif status is Status.RUNNING:
            self._running_since[job.id] = time.monotonic()
        elif status is Status.QUEUED:
            self._running_since.pop(job.id, None)  # sent back to the queue by a shutdown
        elif status.final:
            self.finished.labels(model, status.value).inc()
            started = self._running_since.pop(job.id, None)
            ran = None if started is None else time.monotonic() - started
            if ran is not None:
                self.run.labels(model).observe(ran)
            self.recent.add(model, status is Status.COMPLETED, self._waited.pop(job.id, None), ran)
            if status is Status.COMPLETED and job.result_size is not None:
                self.result.labels(model).observe(job.result_size)


class _StateCollector:
    """What the server is doing right now, read at each scrape from the controller's board."""

    def __init__(self, board: Callable[[], Board], sessions: Callable[[], int]) -> None:
        self._board = board
        self._sessions = sessions

    def describe(self) -> list[Metric]:
        return []  # the families depend on the catalog; collected on each scrape

    def collect(self) -> Iterator[Metric]:
        board = self._board()
        queue = GaugeMetricFamily("nnhost_queue_length", "Requests waiting, by model.", labels=["model"])
        running = GaugeMetricFamily("nnhost_jobs_running", "Requests running now, by model.", labels=["model"])
        level = GaugeMetricFamily(
            "nnhost_deployment_level", "1 for the level each model is at (HOT, WARM, COLD).",
            labels=["model", "level"],
        )
        replicas = GaugeMetricFamily(
            "nnhost_replicas", "Replicas by model and state.", labels=["model", "state"]
        )
        restarts = CounterMetricFamily(
            "nnhost_worker_restarts", "Model worker processes that died and were restarted.",
            labels=["model"],
        )
        faults = CounterMetricFamily(
            "nnhost_containment_faults",
            "Jobs stopped by containment: protocol violations, memory and time limits, crashes.",
            labels=["model", "kind"],
        )
        for model in board.models:
            name = model.name
            queue.add_metric([name], model.queued)
            running.add_metric([name], model.running)
            for each in (Level.HOT, Level.WARM, Level.COLD):
                level.add_metric([name, each], 1.0 if model.level == each else 0.0)
            for state, count in sorted(model.replicas.by_state.items()):
                replicas.add_metric([name, state], count)
            counts = dict(model.incidents)
            restarts.add_metric([name], counts.pop(Incident.WORKER_RESTART.value, 0))
            for kind, count in counts.items():
                faults.add_metric([name, kind], count)
        memory = GaugeMetricFamily(
            "nnhost_device_memory_bytes",
            "Memory per device: the budget, and what models placed there hold.",
            labels=["device", "kind"],
        )
        for device, use in board.devices.items():
            memory.add_metric([device, "budget"], use.budget_bytes)
            memory.add_metric([device, "used"], use.used_bytes)
        sessions = GaugeMetricFamily("nnhost_websocket_sessions", "Open client websocket sessions.")
        sessions.add_metric([], self._sessions())
        yield from (queue, running, level, replicas, restarts, faults, memory, sessions)


class Metrics:
    """The server's registry: job counts, HTTP responses and the state read at scrape time.

    Job counts are this process's: on an API process only requests received; on a
    controller (or with ``role = "all"``) the whole lifecycle. The state gauges are
    the controller's board, wherever it is read.
    """

    def __init__(
        self, board: Callable[[], Board], sessions: Callable[[], int], models: Iterable[str]
    ) -> None:
        self.registry = CollectorRegistry()
        self.jobs = JobMetrics(self.registry, models)
        self.http = Counter(
            "nnhost_http_responses", "HTTP responses by method, route and status code.",
            ["method", "route", "code"], registry=self.registry,
        )
        self.registry.register(_StateCollector(board, sessions))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
