"""Messages between nnhost's processes: one JSON object per packet, descriptors alongside.

Every pipe between a replica and its processes is a ``SOCK_SEQPACKET`` socket
pair: the kernel keeps message boundaries, so a message is one ``sendmsg`` and
one ``recvmsg``, and open descriptors (a job's payload and result files, a job
process's own socket) travel with it as ``SCM_RIGHTS``.

The payload is JSON, never pickle: the replica reads messages written by a
process that ran a stranger's code, so nothing it reads may be able to run
code or allocate without bound. `Channel.recv` refuses (raises `BadMessage`,
closing any descriptors that came with it) a packet longer than
`MAX_MESSAGE`, one whose descriptors were cut, and anything that is not a JSON
object.

It knows nothing of jobs; `messages` declares what the objects may be, and
each receiver reads them with it. `Channel.send` writes a `messages` model
(or a plain object, which only a test that plays a beaten job's process
writes: such a process can write anything).
"""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any, Mapping, Optional, Sequence, Union

from pydantic import BaseModel

#: Longest packet accepted (a LOG line is at most 8 KiB; a traceback is cut to 64 KiB).
MAX_MESSAGE = 256 * 1024
#: Most descriptors one message may carry.
MAX_FDS = 4


class BadMessage(Exception):
    """A packet that is not a message of this protocol."""


def pair() -> tuple[socket.socket, socket.socket]:
    """Two connected, close-on-exec sockets; one end for each side."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (left, right):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_MESSAGE)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * MAX_MESSAGE)
    return left, right


class Channel:
    """One end of a packet socket, speaking JSON messages."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Union[BaseModel, Mapping[str, Any]], fds: Sequence[int] = ()) -> None:
        # The model's own Python dump, written by json: pydantic's JSON writer
        # refuses text that is not UTF-8 (a lone surrogate a job printed), which
        # json escapes as it always did.
        fields = message.model_dump() if isinstance(message, BaseModel) else message
        data = json.dumps(fields, separators=(",", ":"), default=str).encode()
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"message of {len(data)} bytes is over {MAX_MESSAGE}")
        ancillary = []
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        self.sock.sendmsg([data], ancillary)

    def recv(self) -> tuple[Optional[dict[str, Any]], list[int]]:
        """The next message and its descriptors; ``(None, [])`` once the peer is gone."""
        data, ancillary, flags, _ = self.sock.recvmsg(
            MAX_MESSAGE + 1, socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        )
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) > MAX_MESSAGE:
                raise BadMessage(f"a packet over {MAX_MESSAGE} bytes or with too many descriptors")
            if not data:
                if fds:
                    raise BadMessage("an empty packet with descriptors")
                return None, []
            try:
                message = json.loads(data)
            except (ValueError, RecursionError) as error:
                raise BadMessage(f"not JSON ({type(error).__name__})") from None
            if not isinstance(message, dict):
                raise BadMessage("not a JSON object")
            return message, fds
        except BadMessage:
            close_all(fds)
            raise

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
