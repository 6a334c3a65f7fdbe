"""Store calls per second on SQLite and on PostgreSQL (the suite's own throwaway server).

Prints, for each database, the rate of the calls the API makes on its event
loop: a key check (one read), a job's walk through its lifecycle (one insert,
five transitions) and LOG lines (one insert each, and 64 to a transaction as the
controller's writer stores a burst). The PostgreSQL server runs
with fsync off (tests/services.py), so its figures are an upper bound.

    PYTHONPATH=src python benchmarks/db_stores.py [--rounds N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from nnhost.auth.keys import KeyStore  # noqa: E402
from nnhost.db import connect, sqlite_url  # noqa: E402
from nnhost.jobs.job import Job, Status  # noqa: E402
from nnhost.jobs.store import JobStore, LogLine  # noqa: E402

WALK = (Status.QUEUED, Status.DISPATCHED, Status.RUNNING, Status.COMPLETED)


def rate(count: int, run) -> float:
    start = time.perf_counter()
    run()
    return count / (time.perf_counter() - start)


def measure(name: str, url: str, rounds: int) -> None:
    database = connect(url)
    keys, jobs = KeyStore(database), JobStore(database)
    key = keys.create_key(keys.add_user("bench@example.org"))

    def checks():
        for _ in range(rounds):
            keys.check(key)

    def lifecycles():
        for index in range(rounds // 10):
            jobs.create(Job(id=f"{name}{index}", user_id=1, model_key="k", deployment="d"))
            for status in WALK:
                jobs.transition(f"{name}{index}", status, status.value)

    def logs():
        for index in range(rounds):
            jobs.add_log("j", f"line {index}")

    def batched_logs():
        # As the controller's writer stores a burst: up to 64 writes per transaction.
        for start in range(0, rounds, 64):
            jobs.apply([LogLine("j", f"line {index}") for index in range(start, min(start + 64, rounds))])

    one, batched = rate(rounds, logs), rate(rounds, batched_logs)
    print(f"{name:10s} key checks/s {rate(rounds, checks):8.0f}   "
          f"job lifecycles/s {rate(rounds // 10, lifecycles):7.0f}   "
          f"LOG lines/s {one:7.0f} one per transaction, {batched:7.0f} 64 per transaction "
          f"({batched / one:.1f}x)", flush=True)
    database.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure("sqlite", sqlite_url(Path(folder) / "bench.sqlite3"), args.rounds)
    from services import Postgres, Unavailable

    server = Postgres()
    try:
        server.start()
    except Unavailable as problem:
        print(f"postgresql skipped: {problem}")
        return
    try:
        measure("postgresql", server.new_database(), args.rounds)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
