"""Results in an S3 bucket: AWS's, or any S3-compatible store named by its endpoint URL.

Every API process of a cluster reaches the same bucket, so a result written
on one machine is downloaded through any of them, or straight from the bucket:
the link a client gets is a presigned GET of the object (SigV4, in the query
string), which the nnsight client fetches like any URL, with no key, header or
redirect. A worker still writes into a local spool file (a contained worker
has no network); the server uploads it once the worker reports COMPLETED and
removes the spool copy.

Credentials come from boto3's standard chain (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws``, or an instance role);
the region from ``AWS_DEFAULT_REGION``/``AWS_REGION`` or the profile
(``us-east-1`` if none). Every call here blocks on the network: code on the
event loop calls the store through `on_loop`, which runs each call in a thread
(`results.ThreadedResults`). This module never imports
boto3 until an S3 store is built, so a directory-store server does not pay for it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from .blobs import check_job_id
from .results import (
    STAGED,
    STORED,
    AsyncResultStore,
    ResultMissing,
    ResultStoreError,
    ThreadedResults,
)

SCHEME = "s3://"
#: SigV4 presigned URLs are valid for at most a week; a client polling later gets a fresh one.
MAX_PRESIGN_SECONDS = 7 * 24 * 3600
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP = re.compile(r"\d+\.\d+\.\d+\.\d+")
_PREFIX_CHARS = re.compile(r"[A-Za-z0-9!_.*'()/-]+")
_NOT_FOUND = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def is_s3_url(text: str) -> bool:
    return text[: len(SCHEME)].lower() == SCHEME


@dataclass(frozen=True)
class S3Location:
    bucket: str
    #: "" or a folder-like prefix ending in "/".
    prefix: str = ""

    def key(self, job_id: str) -> str:
        return f"{self.prefix}{check_job_id(job_id)}{STORED}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


def parse_s3_url(text: str) -> S3Location:
    """``s3://BUCKET[/PREFIX]``, checked against S3's naming rules (ValueError says which)."""
    if not is_s3_url(text):
        raise ValueError(f"{text!r} is not an s3:// URL")
    rest = text[len(SCHEME):]
    if "?" in rest or "#" in rest:
        raise ValueError("an s3:// location takes no query or fragment: use s3://BUCKET[/PREFIX]")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError("the s3:// URL names no bucket: use s3://BUCKET[/PREFIX]")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP.fullmatch(bucket):
        raise ValueError(
            f"{bucket!r} is not a valid bucket name: 3 to 63 lowercase letters, digits, dots "
            "and hyphens, starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix:
        parts = prefix.split("/")
        if (
            not _PREFIX_CHARS.fullmatch(prefix)
            or any(part in ("", ".", "..") for part in parts)
            or len(prefix) > 512
        ):
            raise ValueError(
                f"the prefix {prefix!r} is not accepted: use folder names of letters, digits "
                "and -_.!*'() separated by single slashes"
            )
        prefix += "/"
    return S3Location(bucket, prefix)


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store:
    """Results as objects ``PREFIX/<job id>.result`` in one bucket."""

    def __init__(
        self, url: str, *, endpoint: Optional[str], spool: Path, client: Optional[Any] = None
    ) -> None:
        self.where = parse_s3_url(url)
        self.endpoint = endpoint
        self.spool = Path(spool)
        self.spool.mkdir(parents=True, exist_ok=True)
        self._client = client or self._make_client(endpoint)

    @staticmethod
    def _make_client(endpoint: Optional[str]) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session()
        config = Config(
            signature_version="s3v4",
            # Most S3-compatible stores (MinIO, Ceph, moto) want the bucket in the path.
            s3={"addressing_style": "path" if endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
        )
        return session.client(
            "s3", endpoint_url=endpoint, region_name=session.region_name or "us-east-1",
            config=config,
        )

    @property
    def location(self) -> str:
        where = str(self.where)
        return f"{where} at {self.endpoint}" if self.endpoint else where

    def check(self) -> None:
        """Write and delete a probe object, so a wrong bucket or key fails at start, not at a result."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        probe = f"{self.where.prefix}.nnhost-probe"
        where = self.location
        try:
            self._client.head_bucket(Bucket=self.where.bucket)
            self._client.put_object(Bucket=self.where.bucket, Key=probe, Body=b"")
            self._client.delete_object(Bucket=self.where.bucket, Key=probe)
        except NoCredentialsError:
            raise ResultStoreError(
                f"no credentials for the result store {where}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in nnhost's environment"
            ) from None
        except ClientError as error:
            code = _code(error)
            if code in _NOT_FOUND:
                reason = "the bucket does not exist; create it first, or name another with --results"
            elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                reason = (
                    "these credentials may not read, write and delete objects there "
                    f"({code}); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy"
                )
            else:
                reason = str(error)
            raise ResultStoreError(f"cannot use the result store {where}: {reason}") from None
        except BotoCoreError as error:
            raise ResultStoreError(
                f"cannot reach the result store {where}: {error}; check --results-endpoint "
                "and the network"
            ) from None

    def staging_path(self, job_id: str) -> Path:
        return self.spool / f"{check_job_id(job_id)}{STAGED}"

    def commit(self, job_id: str) -> Optional[int]:
        staged = self.staging_path(job_id)
        if staged.is_file():
            # Managed transfer: multipart (and parallel) for large results.
            self._client.upload_file(str(staged), self.where.bucket, self.where.key(job_id))
            staged.unlink(missing_ok=True)
        return self.size(job_id)

    def write(self, job_id: str, data: bytes) -> int:
        self._client.put_object(Bucket=self.where.bucket, Key=self.where.key(job_id), Body=data)
        return len(data)

    def open(self, job_id: str) -> BinaryIO:
        from botocore.exceptions import ClientError

        try:
            answer = self._client.get_object(Bucket=self.where.bucket, Key=self.where.key(job_id))
        except ClientError as error:
            if _code(error) in _NOT_FOUND:
                raise ResultMissing(job_id) from None
            raise
        # botocore's StreamingBody: file-like for what callers do with it (read, close).
        body: BinaryIO = answer["Body"]
        return body

    def read(self, job_id: str) -> bytes:
        body = self.open(job_id)
        try:
            return body.read()
        finally:
            body.close()

    def size(self, job_id: str) -> Optional[int]:
        from botocore.exceptions import ClientError

        try:
            head = self._client.head_object(Bucket=self.where.bucket, Key=self.where.key(job_id))
        except ClientError as error:
            if _code(error) in _NOT_FOUND:
                return None
            raise
        return int(head["ContentLength"])

    def exists(self, job_id: str) -> bool:
        return self.size(job_id) is not None

    def signed_url(self, job_id: str, ttl: float, base_url: str) -> str:
        seconds = max(1, min(int(ttl), MAX_PRESIGN_SECONDS))
        url: str = self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.where.bucket, "Key": self.where.key(job_id)},
            ExpiresIn=seconds,
        )
        return url

    def delete(self, job_id: str) -> None:
        self.staging_path(job_id).unlink(missing_ok=True)  # first: it goes even if S3 is down
        self._client.delete_object(Bucket=self.where.bucket, Key=self.where.key(job_id))

    def expire(self, before: float) -> int:
        prefix = self.where.prefix
        old = []
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.where.bucket, Prefix=prefix
        )
        for page in pages:
            for item in page.get("Contents", ()):
                name = item["Key"][len(prefix):]
                # Only our own objects: a result directly under the prefix.
                if "/" in name or not name.endswith(STORED):
                    continue
                if item["LastModified"].timestamp() < before:
                    old.append({"Key": item["Key"]})
        for start in range(0, len(old), 1000):
            self._client.delete_objects(
                Bucket=self.where.bucket, Delete={"Objects": old[start:start + 1000], "Quiet": True}
            )
        with os.scandir(self.spool) as entries:
            for entry in entries:
                try:
                    if entry.name.endswith(STAGED) and entry.stat().st_mtime < before:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass
        return len(old)

    def on_loop(self) -> AsyncResultStore:
        return ThreadedResults(self)
