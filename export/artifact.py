"""Artifact directories: atomic writes, the manifest, and the overwrite rule.

An artifact directory holds `model.pte` (plus `aoti_cuda_blob.ptd` for CUDA),
the resolved `config.yaml` and `manifest.json`. Every file is written to a
temporary name in the same directory and renamed into place, so a failed or
interrupted export never leaves a truncated file. The manifest goes last and is
removed first: a directory whose manifest names the program files is complete.
"""

import hashlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

PTE = "model.pte"
CONFIG = "config.yaml"
MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """A user error about an artifact directory; the message says what to do."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; artifacts are shared files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path} is unreadable ({e}); re-export with --force") from None


def check_overwrite(directory: Path, digest: str, force: bool) -> None:
    """Refuse to replace an artifact of a different config unless forced."""
    if force or not directory.exists():
        return
    manifest = read_manifest(directory)
    if manifest is None:
        if (directory / PTE).exists():
            raise ArtifactError(
                f"{directory} holds a {PTE} without a {MANIFEST} (not written by dflash-et, or an "
                "export was interrupted); pass --force to overwrite it"
            )
        return
    if manifest.get("config_digest") != digest:
        raise ArtifactError(
            f"{directory} holds an artifact of a different config "
            f"(digest {str(manifest.get('config_digest'))[:12]}); pass --force to overwrite it, "
            "or choose another --output-dir"
        )


def write_artifact(directory: Path, files: dict[str, bytes], config_yaml: str, manifest: dict) -> None:
    """Write program files, config and manifest; the manifest lands last."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    manifest = dict(manifest, files={n: {"bytes": len(d), "sha256": sha256(d)} for n, d in files.items()})
    for name, data in files.items():
        write_atomic(directory / name, data)
    write_atomic(directory / CONFIG, config_yaml.encode())
    write_atomic(directory / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def open_checked(directory: Path, digest: str) -> dict:
    """The manifest of an artifact that can run in the pip `executorch.runtime` and was
    exported from the config with `digest`, its files intact; else an ArtifactError."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise ArtifactError(f"{directory} has no {MANIFEST}; run `dflash-et export` first")
    if manifest.get("config_digest") != digest:
        raise ArtifactError(
            f"{directory} was exported from a different config than the one given; "
            "pass the config it was exported with, or re-export"
        )
    if manifest.get("backend") == "cuda":
        raise ArtifactError(
            "CUDA artifacts cannot run in the pip `executorch.runtime` (a CPU build without "
            "CudaBackend); run CUDA programs on a GPU with the ExecuTorch CUDA runtime"
        )
    verify_files(directory, manifest)
    return manifest


def verify_files(directory: Path, manifest: dict) -> None:
    """The program files are the ones the manifest names, byte for byte."""
    for name, meta in manifest.get("files", {}).items():
        path = directory / name
        if not path.exists():
            raise ArtifactError(f"{path} is missing; re-export the artifact")
        if sha256(path.read_bytes()) != meta["sha256"]:
            raise ArtifactError(f"{path} does not match its manifest (changed after export); re-export")


class Progress:
    """Stage-by-stage progress with timings, on stderr."""

    def __init__(self, total: int, stream=None, prefix: str = "dflash-et"):
        self.total, self.done, self.prefix = total, 0, prefix
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()

    def say(self, text: str) -> None:
        print(f"[{self.prefix}] {text}", file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str):
        self.done += 1
        self.say(f"[{self.done}/{self.total}] {name} ...")
        t0 = time.perf_counter()
        yield
        self.say(f"[{self.done}/{self.total}] {name}: done in {time.perf_counter() - t0:.1f}s")

    def finish(self, text: str) -> None:
        self.say(f"{text} ({time.perf_counter() - self.started:.1f}s total)")
