"""The one way code on the event loop calls something that blocks.

A database query, a file read or an S3 upload holds its thread until it
returns; on the event loop that thread is every websocket and request of this
process. Code on the loop therefore never calls a blocking method itself: it
awaits `run_blocking` with it, and the call runs in the default thread pool.
Every such hop goes through here, so it is one thing to find, count or change.

What blocks is said by the contracts, not by flags: the job store
(`jobs.store.JobStore`), the key store (`auth.keys`), the payload stores
(`storage.payloads.JobPayloads`) and the result store's blocking side
(`storage.results.ResultStore`) all block; `storage.results.AsyncResultStore`
is the result store as the loop calls it, with coroutine methods.
"""

from __future__ import annotations

import asyncio
from typing import Callable, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def run_blocking(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)`` in a worker thread; the loop serves others until it returns."""
    return await asyncio.to_thread(call, *args, **kwargs)
