"""Files kcm writes that others read while it runs (written whole or not at all), and settings files it reads."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO


MAX_SETTINGS_BYTES = 1024 * 1024  # far above any properties or YAML file kcm takes


def read_settings(path: str | Path | BinaryIO, encoding: str = "utf-8", limit: int = MAX_SETTINGS_BYTES) -> str:
    """A settings file a user names (client properties, a YAML config), or a stream such as standard input, read whole
    but refused past `limit` bytes: a wrong file or /dev/zero must not take the memory. Raises OSError (strerror says
    why) or UnicodeDecodeError."""
    if isinstance(path, (str, Path)):
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    else:
        data = path.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // 1024 // 1024} MiB: is it the right file?")
    return data.decode(encoding)


def write_atomically(path: Path, content: bytes) -> None:
    """Write `content` to a private (0600) temp file beside `path`, sync it and rename it into place: a reader sees
    the old file or the new one, never half of one; writers side by side never collide; a crash leaves no half file."""
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
