"""``manifest.json``: the size and sha256 of every file of a checkpoint directory.

Every checkpoint writer puts it in its staging directory last, just before the rename, so
a checkpoint whose files match its manifest is exactly what was written. Readers check it
before they read anything else but ``config.json`` (JSON, which cannot run code):

- sizes always (``load_pretrained``): cheap, and it catches a truncated or half-copied
  file;
- sizes and sha256 on ``--resume`` and ``astrai export``, and on ``astrai generate`` and
  ``astrai serve`` when asked (``--verify``) or when the checkpoint is small enough that
  hashing it costs a few seconds at most (:func:`hash_by_default`): reading every byte
  of a multi-GB model on each load would be too slow.

A file in the directory that the manifest does not list is refused too: nothing unlisted
is read. A listed file must lie inside the directory (no ``..``, no absolute name, no
link leading out of it), and the files that other files name (the shards of
``model.safetensors.index.json``, the storage items of ``dcp/.metadata``) must be listed:
every byte a load reads is inside the checkpoint and hashed
(:func:`require_listed`). A directory without a manifest (written by an older astrai, or by hand) is
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
# Checkpoints up to this many bytes are hashed by `generate` and `serve` unless told not
# to: sha256 reads about 400 MB/s on one core of a small machine, so this costs a few
# seconds, against a model load that reads the files anyway.
HASH_BY_DEFAULT_BYTES = 1 << 30
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
    inside = directory.resolve()
    for relative, entry in files.items():
        path = directory / relative
        if (".." in Path(relative).parts or Path(relative).is_absolute()
                or not path.resolve().is_relative_to(inside)):  # a link leading out
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


def hash_by_default(directory: str | os.PathLike, verify: bool | None) -> bool:
    """Whether a load of ``directory`` hashes its files: ``verify`` when given, else when
    the files its manifest lists total at most :data:`HASH_BY_DEFAULT_BYTES` (a directory
    without a valid manifest is refused by the verification itself)."""
    if verify is not None:
        return verify
    try:
        files = _read(Path(directory))
    except CheckpointError:
        return False
    return sum(entry["size"] for entry in files.values()) <= HASH_BY_DEFAULT_BYTES


def _inside(relative: object) -> bool:
    """Whether ``relative`` is a file name that stays inside the directory it is joined
    to: a non-empty relative path without ``..``."""
    return (isinstance(relative, str) and bool(relative.strip()) and "\x00" not in relative
            and not Path(relative).is_absolute() and ".." not in Path(relative).parts)


def require_listed(directory: Path, relative: object, named_in: Path, under: str = "") -> int:
    """The size of the file ``relative`` (in ``directory/under``) that ``named_in`` (an
    index, DCP metadata) names in checkpoint ``directory``: it must stay inside and, where
    the directory has a manifest, be listed in it (so it was hashed); CheckpointError
    naming ``named_in`` otherwise. Without a manifest (a Hugging Face directory being
    imported) the file must exist (a link is followed: the Hugging Face cache links its
    snapshots' files to blobs beside them)."""
    if not _inside(relative):
        raise CheckpointError(f"{named_in} names {relative!r}, outside the checkpoint "
                              f"{directory}; refusing to read it")
    key = f"{under}/{relative}" if under else relative
    if (directory / MANIFEST_FILE).is_file():
        entry = _read(directory).get(key)
        if entry is None:
            raise CheckpointError(f"{named_in} names {relative!r}, which the checkpoint's "
                                  f"{MANIFEST_FILE} does not list; refusing to read it")
        return entry["size"]
    path = directory / key
    if not path.is_file():
        raise CheckpointError(f"{_noun(key)}{path} is missing ({named_in} names it)")
    return path.stat().st_size


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
