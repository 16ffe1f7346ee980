"""Files kcm writes that others read while it runs: written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
