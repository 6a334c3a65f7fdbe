"""The nnsight remote-execution protocol: /request, /subscribe, /response, /result.

HTTP and websocket only: parse, authenticate, translate to and from the job
service, and nothing else. See PROTOCOL.md for the contract these routes keep.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, AsyncIterator, Optional, Union

from fastapi import APIRouter, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData, UploadFile

from ..client_versions import socketio_era
from ..front.jobs import SessionNotOwned, Submission, UnknownModel
from ..jobs.bus import Frame
from ..jobs.job import Job
from ..models.catalog import InvalidModelKey
from ..storage.blocking import run_blocking
from ..storage.results import ResultMissing
from ..wire import RequestEnvelope
from . import legacy, replies
from .deps import (
    API_KEY_HEADER,
    BodyTooLarge,
    bounded,
    check_client_version,
    client_python,
    client_version,
    identify,
    require_admitted,
    require_principal,
    server_of,
    server_of_socket,
    validation_problems,
)

if TYPE_CHECKING:
    from .server import Server

router = APIRouter()
log = logging.getLogger("nnhost.api")
#: Bytes read from the result store per step of a /result download.
RESULT_CHUNK = 1 << 20


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _too_large(size: int, limit: int, known: bool = True) -> HTTPException:
    amount = f"{size:,} bytes" if known else f"more than {limit:,} bytes"
    return HTTPException(
        413,
        f"The request is {amount}, over this server's limit of {limit:,} bytes. Send "
        "less data with one request (fewer or shorter prompts, smaller tensors "
        "captured from your session).",
    )


async def _read_form(request: Request, limit: int) -> FormData:
    try:
        return await bounded(request, limit).form(max_files=2, max_fields=8)
    except BodyTooLarge as error:
        raise _too_large(error.size, limit, error.known) from None
    except HTTPException:
        raise
    except Exception as error:
        raise HTTPException(400, f"The request body is not a valid multipart form: {error}") from None


async def _read_body(request: Request, limit: int) -> bytes:
    try:
        return await bounded(request, limit).body()
    except BodyTooLarge as error:
        raise _too_large(error.size, limit, error.known) from None


def _json(model: BaseModel) -> Response:
    """A model as the JSON body, serialized once (not dumped, parsed and dumped again)."""
    return Response(model.model_dump_json(), media_type="application/json")


def _parse_envelope(raw: Union[UploadFile, str, None]) -> Submission:
    if not isinstance(raw, str):
        raise HTTPException(422, "The form field 'data' is missing: it must hold the request's JSON.")
    try:
        envelope = RequestEnvelope.model_validate_json(raw)
    except ValidationError as error:
        fields = validation_problems(error, "data")
        raise HTTPException(422, f"The form field 'data' is not a valid request: {fields}") from None
    return Submission(
        model_key=envelope.model_key,
        session_id=envelope.session_id,
        compress=envelope.compress,
        env=envelope.env,
    )


@router.post("/request")
async def submit_request(request: Request) -> Response:
    server = server_of(request)
    check_client_version(request)
    principal, limits = await require_admitted(request)
    version = client_version(request)
    if socketio_era(version):
        submission = legacy.submission(request.headers)
        blob = await _read_body(request, limits.request_bytes)
        if not blob:
            raise HTTPException(422, "The request's body is empty: it must hold the serialized trace.")
    else:
        form = await _read_form(request, limits.request_bytes)
        submission = _parse_envelope(form.get("data"))
        upload = form.get("blob")
        if not isinstance(upload, UploadFile):
            raise HTTPException(422, "The form file 'blob' is missing: it must hold the serialized trace.")
        blob = await upload.read()
        if not blob:
            raise HTTPException(422, "The form file 'blob' is empty.")
    submission.client_python = client_python(request)
    submission.client_version = version
    try:
        job = await server.jobs.submit(principal, submission, blob, _base_url(request))
    except InvalidModelKey as error:
        raise HTTPException(422, f"The request's model_key is invalid: {error}") from None
    except UnknownModel as error:
        raise HTTPException(404, str(error)) from None
    except SessionNotOwned as error:
        raise HTTPException(403, str(error)) from None
    return _json(_job_response(server, job, _base_url(request)))


def _job_response(server: Server, job: Job, base_url: str) -> BaseModel:
    """The job as its client parses it (a client before 0.8 knows fewer statuses)."""
    if socketio_era(job.client_version):
        return legacy.job_response(server, job, base_url)
    return replies.job_response(server, job, base_url)


@router.get("/response/{job_id}")
async def job_response(job_id: str, request: Request) -> Response:
    server = server_of(request)
    principal = await require_principal(request)
    job = await server.jobs.get(job_id)
    if job is None or job.user_id != principal.user_id:
        raise HTTPException(404, f"No job {job_id} for this API key.")
    return _json(_job_response(server, job, _base_url(request)))


@router.get("/result/{job_id}")
async def job_result(
    job_id: str, request: Request, expires: int = 0, sig: str = ""
) -> StreamingResponse:
    """A result by its signed link, streamed from the result store (no key: the link is the key)."""
    server = server_of(request)
    if not server.signer.verify(job_id, expires, sig):
        raise HTTPException(
            403, "This result link is invalid or has expired. Poll the job again for a fresh link."
        )
    # The sweep deletes a result when its retention ends: if it is stored, it is current.
    store = server.results.on_loop()
    try:
        size = await store.size(job_id)
        body = await store.open(job_id) if size is not None else None
    except (ResultMissing, ValueError):
        body = None
    if body is None:
        raise HTTPException(410, "This result is no longer kept on the server. Run the request again.")

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while chunk := await run_blocking(body.read, RESULT_CHUNK):
                yield chunk
        finally:
            await run_blocking(body.close)

    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={
            "content-length": str(size),
            "content-disposition": f'attachment; filename="{job_id}.result"',
        },
    )


def _frame(server: Server, published: Frame) -> Optional[Union[str, bytes]]:
    """What the client gets for a published update; None for one that does not decode."""
    update = replies.published_update(published)
    return None if update is None else replies.update_frame(server, update)


@router.websocket("/subscribe")
async def subscribe(websocket: WebSocket) -> None:
    server = server_of_socket(websocket)
    principal = await identify(server, websocket.headers.get(API_KEY_HEADER))
    await websocket.accept()
    session = await server.bus.open(principal.user_id if principal else None)
    receiver = getter = None
    try:
        await websocket.send_text(json.dumps({"session_id": session.id}))
        # Wait on two things at once: the next update for this session, and the
        # client going away (so a closed session stops collecting updates).
        receiver = asyncio.ensure_future(websocket.receive())
        while True:
            if getter is None:
                getter = asyncio.ensure_future(session.next())
            done, _ = await asyncio.wait({receiver, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                frame, getter = _frame(server, getter.result()), None
                if frame is None:
                    pass
                elif isinstance(frame, bytes):
                    await websocket.send_bytes(frame)
                else:
                    await websocket.send_text(frame)
            if receiver in done:
                if receiver.result().get("type") == "websocket.disconnect":
                    break
                receiver = asyncio.ensure_future(websocket.receive())
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        for task in (receiver, getter):
            if task is not None:
                task.cancel()
        await server.bus.close(session.id)
