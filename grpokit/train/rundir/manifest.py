"""A checkpoint's manifest: the size and SHA-256 of each of its files, and what the run folder held when it was saved.

``step-N/manifest.json`` is written last into the temporary folder, after every file was flushed to disk (fsync),
and the folder is then renamed into place. A resume checks every file against it, so a file that is missing,
empty, truncated or changed by one bit is refused with one line naming it, instead of loading garbage or failing
deep inside torch. ``run`` records the store's steps and digest and metrics.jsonl's length and digest at that
moment (``RunLog.seal``), which the resume checks the same way (``train/rundir/resume.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 20


class ManifestError(Exception):
    """A checkpoint folder whose files do not match its manifest (the message names the file and how)."""


def file_digest(path: Path, sync: bool = False) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex) of ``path``; ``sync``: also flush it to disk first."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_manifest(folder: Path, run: dict | None = None) -> None:
    """Record every file of ``folder`` (synced to disk) and ``run`` in ``folder/manifest.json``."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        size, sha = file_digest(path, sync=True)
        files[path.relative_to(folder).as_posix()] = {"bytes": size, "sha256": sha}
    manifest = {"format": FORMAT, "files": files, "run": run}
    with open(folder / MANIFEST, "w") as f:
        f.write(json.dumps(manifest, indent=1))
        f.flush()
        os.fsync(f.fileno())


def read_manifest(folder: Path) -> dict:
    """The manifest of ``folder``, unchecked; ManifestError when it is missing or unreadable."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ManifestError(
            f"{MANIFEST} is missing (the checkpoint is incomplete, or was written by a grpokit without checkpoint "
            "manifests)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{MANIFEST} is unreadable ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ManifestError(f"{MANIFEST} is not a checkpoint manifest")
    return manifest


def verify_folder(folder: Path) -> dict:
    """Check every file the manifest lists (size, then checksum); returns the manifest or raises ManifestError
    naming the first damaged file."""
    if not folder.is_dir():
        raise ManifestError("the folder does not exist")
    manifest = read_manifest(folder)
    for name, expected in manifest["files"].items():
        path, want = folder / name, int(expected["bytes"])
        if not path.is_file():
            raise ManifestError(f"{name} is missing")
        size = path.stat().st_size
        if size != want:
            if size == 0:
                raise ManifestError(f"{name} is empty (0 bytes, {want} expected)")
            how = "truncated" if size < want else "longer than written"
            raise ManifestError(f"{name} is {how} ({size} bytes, {want} expected)")
        if file_digest(path)[1] != expected["sha256"]:
            raise ManifestError(f"{name} does not match its SHA-256 checksum (corrupted)")
    return manifest
