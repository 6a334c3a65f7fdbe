"""The server's log lines: plain text by default, one JSON object per line on request.

`configure` sets up the root logger once for the whole process (nnhost's own
loggers and uvicorn's alike propagate to it), so every line has one format.
In JSON mode a line carries the fields a log pipeline filters on: ``job_id``,
``status``, ``model`` and ``user_id`` where the record is about a job, and
``request_id`` where it was written while an HTTP request was being handled
(`request_id` is set by the API's middleware). A JSON line can hold any text
without breaking the one-line-per-event rule; text lines are the caller's
responsibility (see `jobs.text.one_line`). This module never decides what
is logged, only how.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from typing import Optional

#: The id of the HTTP request being handled, for the lines written while it is.
request_id: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("request_id", default=None)

#: Record attributes copied into a JSON line when a record has them.
FIELDS = ("job_id", "status", "model", "user_id")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        current = request_id.get()
        if current is not None:
            line["request_id"] = current
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(log_format: str = "text", level: str = "info") -> None:
    """One handler on stderr for the whole process, in ``log_format`` ('text' or 'json')."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        # uvicorn's loggers write through the root handler, in the same format.
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(level.upper())
