"""A job's error as the user would see it locally: only their own frames.

`runner` reports a failed job with `user_traceback`: frames in the server's
own code, the standard library and installed packages are left out. It must
never show the server's paths or source to the user, nor hide the user's own.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback


def _server_roots() -> tuple[str, ...]:
    """Folders whose frames are the server's business, not the user's."""
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.abspath(path))
    roots.update(os.path.abspath(p) for p in sys.path if "site-packages" in p)
    return tuple(sorted(roots))


_SERVER_ROOTS = _server_roots()


def _is_users_frame(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return False
    return not os.path.abspath(filename).startswith(_SERVER_ROOTS)


def user_traceback(error: BaseException) -> str:
    """The exception as the user would see it locally: only their own frames.

    The block's source was registered in `linecache` by the deserializer under
    the user's filename, so those frames show the user's lines.
    """
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if _is_users_frame(frame.filename)
    ]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(error), error))
    return "".join(lines).rstrip("\n")
