"""kopf's routine log lines that kcm quiets: with hundreds of resources, kopf's line for every drift check and every
liveness probe would drown kcm's own."""

from __future__ import annotations

import logging

# logger → kopf's INFO lines for a routine success, shown at DEBUG only
ROUTINE = {
    "kopf.objects": frozenset({"Timer 'drift' succeeded."}),
}
QUIET_BELOW_WARNING = ("aiohttp.access",)   # a line per /healthz request
# Whose failures are said without kopf's traceback unless at DEBUG: kopf's requests to an API server that does not
# answer (a traceback for each of its retries; each message says what failed).
NO_TRACEBACK = ("kopf._core.reactor.observation", "kopf._core.reactor.running")


class Routine(logging.Filter):
    """Demote `messages` of a logger to DEBUG (dropped unless it logs DEBUG), and drop the traceback of its failures
    unless at DEBUG when `tracebacks` is false."""

    def __init__(self, logger: logging.Logger, messages: frozenset[str], tracebacks: bool = True) -> None:
        super().__init__()
        self.logger, self.messages, self.tracebacks = logger, messages, tracebacks

    def filter(self, record: logging.LogRecord) -> bool:
        debug = self.logger.isEnabledFor(logging.DEBUG)
        if record.levelno == logging.INFO and record.getMessage() in self.messages:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return debug
        if not self.tracebacks and record.exc_info and not debug:
            record.exc_info, record.exc_text = None, None
        return True


def quiet_kopf() -> None:
    """Install the filters and levels above (once per logger)."""
    for name in {*ROUTINE, *NO_TRACEBACK}:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, Routine) for existing in logger.filters):
            logger.addFilter(Routine(logger, ROUTINE.get(name, frozenset()), tracebacks=name not in NO_TRACEBACK))
    for name in QUIET_BELOW_WARNING:
        logger = logging.getLogger(name)
        logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
