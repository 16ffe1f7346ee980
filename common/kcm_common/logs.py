"""Structured logs for the long-running commands: one JSON object per line (with the Kubernetes object kopf attaches
to the operator's records)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
import traceback

from kcm_common.terminal import printable

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT lines whose message has its control characters escaped (`printable`): a client id or subscription
    name a log line quotes is anyone's text, and an escape sequence would recolour or clear the terminal. A message's
    own lines (a stack kcm shows) go on indented by CONTINUATION, so none passes for a log line of its own; a
    traceback after the message keeps its lines. A line kopf logs about a resource starts `[namespace/name]`, as
    kopf's own text format does."""

    CONTINUATION = "    "

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        escaped = logging.makeLogRecord(record.__dict__)
        message = record.message
        ref = getattr(record, "k8s_ref", None)   # kopf's per-object loggers: the resource a line is about
        if isinstance(ref, dict) and ref.get("name"):
            where = "/".join(str(ref[key]) for key in ("namespace", "name") if ref.get(key))
            if not message.startswith(f"{where}: "):   # kcm's own lines about a resource start so already
                message = f"[{where}] {message}"
        escaped.message = ("\n" + self.CONTINUATION).join(printable(line) for line in message.split("\n"))
        return super().formatMessage(escaped)


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", "namespace", "name"}`; exceptions as `"error"`."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers set it
        if isinstance(ref, dict):
            entry.update({key: ref[key] for key in ("namespace", "name") if ref.get(key)})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def use_json(root: logging.Logger | None = None) -> None:
    """Switch every handler of the root logger to JSON lines."""
    for handler in (root or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())


def where_blocked(thread: threading.Thread, frames: int = 8) -> str:
    """The last `frames` frames of `thread`'s stack, innermost last: what a report of a call that never returns
    needs. "(ended)" for a thread that has."""
    frame = sys._current_frames().get(thread.ident)  # noqa: SLF001 (the documented way to see another thread)
    return "".join(traceback.format_stack(frame)[-frames:]).rstrip("\n") if frame is not None else "(ended)"
