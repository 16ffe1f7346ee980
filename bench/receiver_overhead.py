"""Receiver overhead: what kcm's plugin costs a broker's request thread, and whether every push gets written.

Times `exportMetrics` (Kafka 4.2 API) per call on the calling thread at INSTANCES client instances pushing 2-4 KB,
beside a bare copy of the same payload measured in the same run (the least any plugin must do), then waits until the
plugin's producer has written every push to the sandbox's metrics topic. Prints the figures and their ratio.
Usage: .venv/bin/python bench/receiver_overhead.py [INSTANCES] [PUSHES]
"""

from __future__ import annotations

import json
import subprocess
import sys

from kcm_sandbox.java_receiver import build_dir, ensure_built, jar_path, runtime_classpath
from kcm_sandbox.runner import Sandbox, SandboxOptions


def main() -> None:
    instances = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    pushes = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    ensure_built()
    with Sandbox(SandboxOptions(listen=("127.0.0.1", 0), topic="bench-client-metrics")) as sandbox:
        done = subprocess.run(
            ["java", "-Xmx768m", "-cp", runtime_classpath(build_dir() / "kcm-receiver-bench.jar", jar_path()),
             "dev.kcm.receiver.bench.OverheadBench", sandbox.bootstrap, sandbox.options.topic, str(instances),
             str(pushes)],
            capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark failed:\n{done.stderr}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(figures, indent=2))
    print(f"exportMetrics p50 {figures['export_p50_us']:.2f} us, p99 {figures['export_p99_us']:.2f} us "
          f"(bare copy p50 {figures['copy_p50_us']:.2f} us, p99 {figures['copy_p99_us']:.2f} us; "
          f"p99 ratio {figures['export_p99_us'] / max(figures['copy_p99_us'], 0.01):.1f}x); "
          f"{figures['written_per_s']:.0f} pushes/s written; "
          f"{figures['written']}/{figures['pushes']} written, {figures['dropped']} dropped, "
          f"{figures['producer_errors']} producer errors")


if __name__ == "__main__":
    main()
