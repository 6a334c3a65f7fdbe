"""A real S3 endpoint on loopback for the tests: moto's server mode, on a free port.

`S3Endpoint` starts moto's threaded server on 127.0.0.1 and stops it at the
end; the nnhost server under test reaches it over HTTP exactly as it would
reach AWS or MinIO (`--results s3://... --results-endpoint URL`). The
credentials are moto's dummies, handed to the server in the standard AWS
environment variables.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from nnhost.testing import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Endpoint:
    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        # One line per S3 request on stderr drowns the test output.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> "S3Endpoint":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        answer = self.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for item in answer.get("Contents", ()))


@contextmanager
def aws_environment():
    """This process's boto3 sees moto's dummy credentials (restored afterwards)."""
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
