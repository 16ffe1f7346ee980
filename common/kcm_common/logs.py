"""Structured logs for the long-running commands: one JSON object per line (with the Kubernetes object kopf attaches
to the operator's records)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
import traceback


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
