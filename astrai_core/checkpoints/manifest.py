"""``manifest.json``: the size and sha256 of every file of a checkpoint directory.

Every checkpoint writer puts it in its staging directory last, just before the rename, so
a checkpoint whose files match its manifest is exactly what was written. Readers check it
before they read anything else but ``config.json`` (JSON, which cannot run code):

- sizes always (``load_pretrained``, ``astrai generate``, ``astrai serve``): cheap, and it
  catches a truncated or half-copied file;
- sizes and sha256 on ``--resume`` and ``astrai export`` (reading every byte of a
  multi-GB model on each load would be too slow for the others).

A file in the directory that the manifest does not list is refused too: nothing unlisted
is read. A directory without a manifest (written by an older astrai, or by hand) is
refused with the way to accept it: ``astrai manifest DIR`` writes one for the files as
they are, for someone who trusts them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from astrai_core.errors import CheckpointError

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "astrai-manifest-v1"
_CHUNK = 1 << 20
_verified: dict[str, tuple] = {}  # hashed directories -> the stat of their files then


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    """Every regular file under ``directory`` but the manifest, sorted, hidden ones too
    (``dcp/.metadata``)."""
    found = [path for path in directory.rglob("*")
             if path.relative_to(directory).as_posix() != MANIFEST_FILE and not path.is_dir()]
    return sorted(found)


def write_manifest(directory: Path) -> Path:
    """Record every file of ``directory``; written aside then renamed, so a manifest is
    either complete or absent."""
    files = {path.relative_to(directory).as_posix():
             {"size": path.stat().st_size, "sha256": sha256_of(path)}
             for path in _files(directory)}
    target = directory / MANIFEST_FILE
    staging = directory / f".{MANIFEST_FILE}.tmp"
    staging.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=2) + "\n")
    os.replace(staging, target)
    return target


def _read(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {MANIFEST_FILE}, so its files cannot be verified (written by "
            f"an older astrai, or not a complete checkpoint); if you trust its files, accept "
            f"it with `astrai manifest {directory}`")
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError(f"not an {MANIFEST_FORMAT} manifest")
        for entry in files.values():
            if not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str):
                raise ValueError("an entry lacks its size or sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a valid manifest: {exc}") from None
    return files


def _noun(relative: str) -> str:
    return "weight file " if relative.endswith(".safetensors") else ""


def verify_manifest(directory: str | os.PathLike, *, hashes: bool = False) -> None:
    """Raise CheckpointError naming the first file of ``directory`` that is missing, of the
    wrong size, (``hashes``) of the wrong content, or not listed in its manifest."""
    directory = Path(directory)
    stats = _stat_key(directory)
    if hashes and _verified.get(str(directory.resolve())) == stats:
        return  # hashed already in this process, and no file has changed since
    files = _read(directory)
    for relative, entry in files.items():
        path = directory / relative
        if ".." in Path(relative).parts or Path(relative).is_absolute():
            raise CheckpointError(f"{directory / MANIFEST_FILE} lists {relative!r}, outside "
                                  "the checkpoint")
        if not path.is_file():
            raise CheckpointError(f"{_noun(relative)}{path} is missing (the manifest lists it)")
        size = path.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(
                f"{_noun(relative)}{path} is truncated or corrupt: {size} bytes, the manifest "
                f"says {entry['size']}")
    unlisted = [p.relative_to(directory).as_posix() for p in _files(directory)
                if p.relative_to(directory).as_posix() not in files]
    if unlisted:
        raise CheckpointError(f"{directory / unlisted[0]} is not listed in the checkpoint's "
                              f"{MANIFEST_FILE}; remove it, or accept the directory as it is "
                              f"with `astrai manifest --force {directory}`")
    if not hashes:
        return
    for relative, entry in files.items():
        if sha256_of(directory / relative) != entry["sha256"]:
            raise CheckpointError(f"{_noun(relative)}{directory / relative} is corrupt or was "
                                  "changed: its sha256 differs from the manifest's")
    _verified[str(directory.resolve())] = stats


def note_written(directory: Path) -> None:
    """Record that ``directory``'s files are the ones its manifest was just computed from
    (its writer hashed them a moment ago), so that a later hashing verification in this
    process (``keep_last``) need not read them back until one of them changes."""
    _verified[str(directory.resolve())] = _stat_key(directory)


def _stat_key(directory: Path) -> tuple:
    """What changes when any file of ``directory`` is written: names, sizes, mtimes."""
    try:
        return tuple((p.as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in sorted(directory.rglob("*")))
    except OSError:
        return ()
