"""Result store figures: committing and downloading a large result, directory vs S3.

For each store: the time to commit a worker's file (a rename; an upload), and
MB/s downloading it the way the nnsight client does (httpx, streamed, no key)
from its signed URL: this server's ``/result`` route for the directory store,
a presigned GET for S3. S3 here is moto's server on loopback, a Python
process: its figures say what our side costs, not what AWS or MinIO give.

    PYTHONPATH=src python benchmarks/result_store.py [--mb 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from moto_s3 import S3Endpoint, aws_environment  # noqa: E402

from nnhost.models.tiny import build_tiny_gpt2  # noqa: E402
from nnhost.storage.links import LinkSigner  # noqa: E402
from nnhost.storage.results import DirectoryStore, ResultStore  # noqa: E402
from nnhost.storage.s3 import S3Store  # noqa: E402
from nnhost.testing import ServerProcess  # noqa: E402

REPO = "nnhost-bench/tiny-gpt2"


def download(url: str) -> tuple[int, float]:
    started = time.perf_counter()
    size = 0
    with httpx.Client(timeout=httpx.Timeout(10, read=120)) as client:
        with client.stream("GET", url) as response:
            response.raise_for_status()
            for chunk in response.iter_bytes(1 << 20):
                size += len(chunk)
    return size, time.perf_counter() - started


def measure(name: str, store: ResultStore, base_url: str, data: bytes, repeats: int) -> None:
    commits, rates = [], []
    for _ in range(repeats):
        job_id = uuid.uuid4().hex
        store.staging_path(job_id).write_bytes(data)
        started = time.perf_counter()
        assert store.commit(job_id) == len(data)
        commits.append(time.perf_counter() - started)
        size, seconds = download(store.signed_url(job_id, 300, base_url))
        assert size == len(data)
        rates.append(size / seconds / 1e6)
        store.delete(job_id)
    print(f"{name:<28} commit {statistics.median(commits) * 1000:8.1f} ms   "
          f"download {statistics.median(rates):7.1f} MB/s   (median of {repeats})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = os.urandom(args.mb * 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-store-"))
    hf_home = root / "hf"
    build_tiny_gpt2(REPO, hf_home=hf_home)
    print(f"{args.mb} MB result", flush=True)
    started = time.perf_counter()
    (root / "plain").write_bytes(data)
    (root / "plain").read_bytes()
    print(f"{'write + read a local file':<28} {time.perf_counter() - started:.3f} s", flush=True)
    with ServerProcess([REPO], data_dir=root / "data", hf_home=hf_home, api_key="nnh_bench_" + "k" * 40) as server:
        signer = LinkSigner.from_file(server.data_dir / "secrets" / "link-signing.key")
        measure("directory, /result route", DirectoryStore(server.data_dir / "results", signer),
                server.url, data, args.repeats)
    with aws_environment():
        endpoint = S3Endpoint().start()
        try:
            endpoint.bucket("bench")
            store = S3Store("s3://bench/runs", endpoint=endpoint.url, spool=root / "spool")
            measure("S3 (moto), presigned GET", store, "", data, args.repeats)
        finally:
            endpoint.stop()


if __name__ == "__main__":
    main()
