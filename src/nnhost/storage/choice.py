"""Which result store a ``results`` setting names: a directory, or an S3 bucket.

A module of its own so that the stores (`results`, `s3`) never import each
other; only this choice knows them both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .links import LinkSigner
from .results import DirectoryStore, ResultStore
from .s3 import S3Store, is_s3_url


def open_result_store(
    results: str, endpoint: Optional[str], *, spool: Path, signer: LinkSigner
) -> ResultStore:
    """The store a ``results`` setting names: ``s3://BUCKET[/PREFIX]`` or a directory.

    ``spool`` is the local folder an S3 store stages workers' results in
    before uploading them.
    """
    if is_s3_url(results):
        return S3Store(results, endpoint=endpoint, spool=spool)
    return DirectoryStore(Path(results), signer)

