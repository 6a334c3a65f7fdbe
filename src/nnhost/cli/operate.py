"""Operator commands that talk to a running server: deploy, evict, status, jobs, cancel.

They are thin HTTP clients of the server's own endpoints, authenticated with
an API key (``--api-key`` or ``NDIF_API_KEY``), so an operator can run them
from any machine that reaches the server (``--url`` or ``NDIF_HOST``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import httpx


def _client(args: argparse.Namespace) -> httpx.Client:
    url = args.url or os.environ.get("NDIF_HOST") or "http://127.0.0.1:8001"
    key = args.api_key or os.environ.get("NDIF_API_KEY") or ""
    headers = {"ndif-api-key": key} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    try:
        with _client(args) as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise SystemExit(f"nnhost: cannot reach the server: {error}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        raise SystemExit(f"nnhost: {response.status_code}: {detail}")
    return response.json()


def _gib(size: Any) -> str:
    from ..units import format_size

    return "-" if not size else format_size(size)


def _status(args: argparse.Namespace) -> int:
    data = _call(args, "GET", "/status")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [("replica", "level", "state", "device", "size", "queued", "busy", "note")]
    for name, entry in data["deployments"].items():
        rows.append((
            name, entry["deployment_level"], entry["application_state"], entry.get("device", "-"),
            _gib(entry.get("size_bytes")), str(entry.get("queued", 0)),
            "yes" if entry.get("busy") else "-", entry.get("note") or "",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for device, usage in data.get("devices", {}).items():
        print(f"{device}: {_gib(usage['used_bytes'])} of {_gib(usage['budget_bytes'])} held by deployments")
    return 0


def _deploy(args: argparse.Namespace) -> int:
    result = _call(args, "POST", "/admin/deploy", json={"model": args.model, "level": args.level})
    print(f"{result['model']}: {result['target']} {result.get('note') or ''}".rstrip())
    return 0


def _evict(args: argparse.Namespace) -> int:
    result = _call(args, "POST", "/admin/evict", json={"model": args.model})
    print(f"{result['model']}: {result['target']}")
    return 0


def _jobs(args: argparse.Namespace) -> int:
    params = {"limit": args.limit}
    if args.user:
        params["user"] = args.user
    if args.model:
        params["model"] = args.model
    jobs = _call(args, "GET", "/admin/jobs", params=params)["jobs"]
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    for job in jobs:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job["created_at"]))
        runtime = f"{job['runtime']:.2f}s" if job.get("runtime") is not None else "-"
        print(f"{job['id']}  {created}  user {job['user_id']}  {job['model']}  "
              f"{job['status']:<12} {runtime}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    _call(args, "POST", f"/jobs/{args.job}/cancel")
    print(f"{args.job}: cancelled")
    return 0


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the operator commands to the ``nnhost`` parser."""

    def connection(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--url", default=None, help="the server (default $NDIF_HOST)")
        parser.add_argument("--api-key", default=None, help="an admin key (default $NDIF_API_KEY)")
        return parser

    status = connection(commands.add_parser("status", help="Deployments, levels and memory."))
    status.add_argument("--json", action="store_true")
    status.set_defaults(run=_status)

    deploy = connection(commands.add_parser("deploy", help="Bring a catalog model up."))
    deploy.add_argument("model")
    deploy.add_argument("--level", choices=["hot", "warm"], default="hot")
    deploy.set_defaults(run=_deploy)

    evict = connection(commands.add_parser("evict", help="Take an idle model down to COLD."))
    evict.add_argument("model")
    evict.set_defaults(run=_evict)

    jobs = connection(commands.add_parser("jobs", help="Recent jobs, newest first."))
    jobs.add_argument("--user", default=None, help="only this user's (email)")
    jobs.add_argument("--model", default=None, help="only this model's")
    jobs.add_argument("--limit", type=int, default=50)
    jobs.add_argument("--json", action="store_true")
    jobs.set_defaults(run=_jobs)

    cancel = connection(commands.add_parser("cancel", help="Cancel a queued or running job."))
    cancel.add_argument("job")
    cancel.set_defaults(run=_cancel)
