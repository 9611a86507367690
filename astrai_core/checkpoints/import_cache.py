"""On-the-fly imports of Hugging Face directories, cached by the source files' hashes.

``model.path`` at a Hugging Face directory of a family with a native importer runs
natively: the directory is imported once, by the same importer and code as
``astrai import``, into ``<cache>/imports/<model_type>-<key>``, and every later run (or
rank) finds it there. The key hashes what decides the import's output: every source file
it reads (config, generation config, weights, tokenizer files), the importer's name and
astrai's version. A file the hub cache stores as a link to a content-addressed blob is
keyed by the blob's name (its hash) without reading it again.

The cache is ``model.cache_dir`` when set, else ``$ASTRAI_CACHE_DIR``, else
``$XDG_CACHE_HOME/astrai`` (``~/.cache/astrai``). Imports are serialized by a file lock,
and a directory appears only when complete (the importer writes aside, then renames).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from astrai_core.checkpoints.hf.files import INDEX_FILE, SINGLE_FILE, read_json
from astrai_core.checkpoints.manifest import MANIFEST_FILE, require_listed, sha256_of
from astrai_core.checkpoints.native_files import TOKENIZER_FILES
from astrai_core.log import get_logger

log = get_logger("astrai.import_cache")
IMPORTS = "imports"
_BLOB = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
_hashes: dict[tuple[str, int, int], str] = {}


def cache_root(configured: str | os.PathLike | None = None) -> Path:
    """Where astrai caches imports (see the module docstring)."""
    if configured is not None:
        return Path(configured).expanduser()
    if os.environ.get("ASTRAI_CACHE_DIR"):
        return Path(os.environ["ASTRAI_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "astrai"


def source_files(src: Path) -> list[Path]:
    """The files of a Hugging Face directory that an import reads."""
    names = ["config.json", "generation_config.json", *TOKENIZER_FILES]
    if (src / INDEX_FILE).is_file():
        shards = sorted(set(read_json(src / INDEX_FILE).get("weight_map", {}).values()))
        for name in shards:  # a shard outside the directory is refused, never hashed
            if (src / name).is_file():
                require_listed(src, name, src / INDEX_FILE)
        names += [INDEX_FILE, *shards]
    else:
        names.append(SINGLE_FILE)
    return [src / name for name in dict.fromkeys(names) if (src / name).is_file()]


def file_hash(path: Path) -> str:
    """A content hash of ``path``: a hub blob's own name, else its sha256 (memoized per
    file version in this process)."""
    target = path.resolve()
    if target != path.absolute() and target.parent.name == "blobs" and _BLOB.match(target.name):
        return target.name
    stat = target.stat()
    key = (str(target), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        _hashes[key] = sha256_of(target)
    return _hashes[key]


def import_key(src: Path, importer_name: str) -> str:
    """The hash that names the import of ``src`` by ``importer_name``."""
    from astrai_core.version import __version__

    digest = hashlib.sha256(f"astrai {__version__}\0importer {importer_name}\0".encode())
    for path in source_files(src):
        digest.update(f"{path.name}\0{file_hash(path)}\0".encode())
    return digest.hexdigest()


def cached_import(src: Path, model_type: str, importer: Any, root: Path) -> Path:
    """The native checkpoint of ``src`` in the cache, importing it first when absent."""
    from filelock import FileLock

    key = import_key(src, importer.name)
    target = root / IMPORTS / f"{model_type}-{key[:24]}"
    if (target / MANIFEST_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if not (target / MANIFEST_FILE).is_file():  # another process may have just made it
            log.info("importing into the cache (once)", source=str(src), destination=str(target))
            importer.import_checkpoint(src, target)
    return target
