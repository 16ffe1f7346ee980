"""docs/contract.md's consumer, written without kcm, run as pasted against the sandbox with a real client pushing."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from test_sandbox_clients import INTERVAL_MS, _subscribe, running_producer

DOC = Path(__file__).resolve().parents[1] / "docs" / "contract.md"


def _example() -> str:
    [block] = re.findall(r"^### Reading the topic without kcm\n.*?^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)
    return block


def test_the_contract_docs_consumer_prints_each_push_of_a_real_client(sandbox, tmp_path):
    _subscribe(sandbox, "everything", metrics="*", **{"interval.ms": str(INTERVAL_MS)})
    script = tmp_path / "read_metrics.py"
    script.write_text(_example())
    lines: list[str] = []
    with running_producer(sandbox, "doc-reader-producer"):
        reader = subprocess.Popen([sys.executable, str(script), sandbox.bootstrap, sandbox.options.topic],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def read() -> None:
                for line in reader.stdout:
                    lines.append(line)
                    if line.startswith("doc-reader-producer "):
                        return
            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            thread.join(90)   # the embedded broker holds a first JoinGroup some 23 s
        finally:
            reader.kill()
            _, err = reader.communicate(timeout=10)
    mine = [line.split() for line in lines if line.startswith("doc-reader-producer ")]
    assert mine, (lines, err)
    client_id, instance, timestamp_ms, count, word = mine[0]
    assert uuid.UUID(instance).version == 4 and word == "metrics" and int(count) > 0, mine[0]
    assert abs(int(timestamp_ms) / 1000 - time.time()) < 120, mine[0]
    assert "not read here" not in err and "Traceback" not in err, err
