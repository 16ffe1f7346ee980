"""The sandbox's CLIENT_METRICS resources, optionally persisted to a JSON state file."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import tempfile

from kcm_common.errors import UserError
from kcm_common.files import read_settings, write_atomically
from kcm_common.client_metrics import (
    ConfigEntry,
    ConfigError,
    Subscription,
    apply_incremental,
    check_value_sizes,
    describe_entries,
    to_subscription,
    validate,
)
from kcm_common.codes import INVALID_REQUEST, UNKNOWN_SERVER_ERROR

log = logging.getLogger("kcm.sandbox")

_STATE_VERSION = 1


class StateFileError(UserError):
    """The subscription state file cannot be read back."""


class SubscriptionStore:
    """The CLIENT_METRICS resources of the sandbox, optionally persisted to a JSON state file."""

    def __init__(self, state_file: pathlib.Path | None = None) -> None:
        self._state_file = pathlib.Path(state_file) if state_file is not None else None
        self._configs: dict[str, dict[str, str]] = {}
        self._generation = 0
        if self._state_file is not None:
            if self._state_file.exists():
                self._configs = _load_state(self._state_file)
            _check_writable(self._state_file)  # at start, not at the first subscription change

    @property
    def generation(self) -> int:
        """Bumped on every effective change, so readers know when to recompute."""
        return self._generation

    def names(self) -> list[str]:
        """Names of the existing subscriptions (what ListConfigResources lists), sorted."""
        return sorted(self._configs)

    def configs(self, name: str) -> dict[str, str]:
        """The raw configs set on a subscription, as they were written; empty when it does not exist."""
        return dict(self._configs.get(name, {}))

    def describe(self, name: str, keys: list[str] | None = None) -> list[ConfigEntry]:
        """DescribeConfigs for one resource; a name never set describes as all defaults, as Kafka 4.x does."""
        if not name:
            raise ConfigError(INVALID_REQUEST, "Client metrics subscription name must not be empty")
        return describe_entries(self._configs.get(name, {}), keys)

    def alter(self, name: str, configs: dict[str, str | None], validate_only: bool = False) -> None:
        """AlterConfigs (legacy): replace every config of the resource; an empty map removes it."""
        nulls = [key for key, value in configs.items() if value is None]
        if nulls:
            raise ConfigError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
        self._commit(name, {key: value for key, value in configs.items() if value is not None}, validate_only)

    def incremental_alter(
        self, name: str, ops: list[tuple[str, int, str | None]], validate_only: bool = False
    ) -> None:
        """IncrementalAlterConfigs: op 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT (the last two on list keys only)."""
        self._commit(name, apply_incremental(self._configs.get(name, {}), ops), validate_only)

    def subscriptions(self) -> list[Subscription]:
        """Every subscription, parsed, in name order."""
        return [to_subscription(name, self._configs[name]) for name in self.names()]

    def _commit(self, name: str, updated: dict[str, str], validate_only: bool) -> None:
        check_value_sizes(self._configs.get(name, {}), updated)
        validate(name, updated)
        if validate_only or updated == self._configs.get(name, {}):
            return
        configs = dict(self._configs)
        if updated:
            configs[name] = updated
        else:
            configs.pop(name, None)
        if self._state_file is not None:
            try:
                _save_state(self._state_file, configs)
            except OSError as exc:  # nothing changed: the client is told, as a broker answers a failure
                log.warning("cannot save the subscriptions to %s (%s); the change to %s is refused",
                            self._state_file, exc.strerror or exc, name)
                raise ConfigError(UNKNOWN_SERVER_ERROR, f"the sandbox cannot save its state file: "
                                                        f"{exc.strerror or exc}") from None
        self._configs = configs
        self._generation += 1


_MAX_STATE_BYTES = 64 * 1024 * 1024   # some 300,000 subscriptions: a larger file is not the sandbox's


def _load_state(path: pathlib.Path) -> dict[str, dict[str, str]]:
    try:
        document = json.loads(read_settings(path, limit=_MAX_STATE_BYTES))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not UTF-8, not JSON
        raise StateFileError(
            f"cannot read the sandbox subscription state {path}: {getattr(err, 'strerror', None) or err}; fix or "
            "delete the file"
        ) from err
    subscriptions = document.get("subscriptions") if isinstance(document, dict) else None
    if not isinstance(subscriptions, dict):
        raise StateFileError(f"{path} has no 'subscriptions' object; fix or delete the file")
    configs: dict[str, dict[str, str]] = {}
    for name, entry in subscriptions.items():
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()) or not entry:
            raise StateFileError(f"{path}: subscription {name!r} must map config names to strings")
        try:
            validate(name, entry)
        except ConfigError as err:
            raise StateFileError(f"{path}: subscription {name!r} is invalid: {err.message}") from None
        configs[name] = dict(entry)
    return configs


def _check_writable(path: pathlib.Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StateFileError(f"--state {path}: cannot write there ({exc.strerror or exc}); choose a path in a "
                             "writable directory") from None


def _save_state(path: pathlib.Path, configs: dict[str, dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": _STATE_VERSION, "subscriptions": configs}, indent=2, sort_keys=True)
    write_atomically(path, (text + "\n").encode("utf-8"))  # a crash never leaves half a file
