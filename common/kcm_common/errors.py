"""The one error type for mistakes a user can fix: every kcm command turns it into one line and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """A bad option, config file, spec or endpoint; the message says what was wrong and what to do."""
