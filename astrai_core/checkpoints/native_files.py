"""The files of a native checkpoint directory: config.json, safetensors weights (sharded
when large), tokenizer files, and the staging directory every save is written into.

Weights only ever go through safetensors (never pickle). A save is written into a hidden
sibling directory and renamed into place at the end, so a directory with the final name
is always complete. Loading a whole checkpoint (LoRA ones included) is
:func:`astrai_core.checkpoints.native.load_pretrained`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from astrai_core.checkpoints.manifest import require_listed
from astrai_core.errors import AstraiError, CheckpointError
from astrai_core.model.config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FORMAT_NAME = "astrai"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "chat_template.jinja",
    "chat_template.json",
    # a vision-language model's processor (image sizes, normalisation, tokens per image),
    # and the video processor's config its family's processor is saved with
    "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
)



# ---------------------------------------------------------------- writing

@contextmanager
def atomic_directory(target: Path, expected_bytes: Callable[[], int] = lambda: 0
                     ) -> Iterator[Path]:
    """Yield a hidden staging directory next to ``target``; on success it replaces ``target``.

    A failure removes the staging directory (``target`` and its siblings are untouched);
    one because the disk is full becomes a CheckpointError naming the directory and the
    bytes the save needs (``expected_bytes()``, when that is more than is free; else, that
    it needs more than is free: the write ran out) and the bytes free once the partial
    write is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        if target.exists():
            trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            target.rename(trash)
            staging.rename(target)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            staging.rename(target)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except BaseException as error:  # DCP's CheckpointException is not an Exception
        full = not isinstance(error, AstraiError) and _disk_full(error, target.parent)
        written = directory_bytes(staging)
        shutil.rmtree(staging, ignore_errors=True)
        if full:
            free = shutil.disk_usage(target.parent).free  # the partial write removed
            needed = max(expected_bytes(), written)
            need = (f"it needs about {needed} bytes, {free} are free" if needed > free else
                    f"it needs more than the {free} bytes that are free")
            raise CheckpointError(
                f"no space left on the device of {target.parent} while writing {target.name}: "
                f"{need}; the earlier checkpoints are intact. Free some space (or lower "
                "trainer.keep_last) and run again") from None
        raise


def directory_bytes(directory: Path) -> int:
    """The bytes of the files under ``directory`` (0 when it is gone)."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _disk_full(error: BaseException, directory: Path) -> bool:
    """Whether ``error`` came from a full disk: an ENOSPC/EDQUOT anywhere in its chain or
    its message (safetensors and DCP wrap it), or, for writers that lose the reason
    (torch.save says only "unexpected pos"), a device with almost no space left."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
                mark in str(seen) for mark in ("No space left on device", "os error 28")):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(directory).free < 1024**2
    except OSError:
        return False


def write_config(config: ModelConfig, directory: Path) -> None:
    from astrai_core.version import __version__

    data = {"format": FORMAT_NAME, "astrai_version": __version__, **config.model_dump()}
    (directory / CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n")


def write_weights(state_dict: Mapping[str, torch.Tensor], directory: Path, max_shard_bytes: int) -> None:
    """One model.safetensors, or HF-style shards plus model.safetensors.index.json."""
    tensors = {name: t.detach().contiguous().cpu() for name, t in state_dict.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += size
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / WEIGHTS_FILE), metadata=metadata)
        return
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / filename), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def copy_tokenizer_files(source: Path, directory: Path) -> list[str]:
    """Copy the tokenizer files present in ``source``; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, directory / name)
            copied.append(name)
    return copied


# ---------------------------------------------------------------- reading

def load_config(directory: str | os.PathLike) -> ModelConfig:
    """Read and validate a native config.json, with CheckpointError naming the file on failure."""
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: not a checkpoint directory")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        hint = " (a Hugging Face checkpoint? convert it with `astrai import`)" if isinstance(
            data, dict) and "model_type" in data else ""
        raise CheckpointError(f"{path} is not an astrai config: no \"format\": \"astrai\"{hint}")
    fields = {k: v for k, v in data.items() if k not in ("format", "astrai_version")}
    try:
        return ModelConfig.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise CheckpointError(f"{path} has an invalid model config: {problems}") from exc


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, or model.safetensors.
    Each shard must be a file inside ``directory`` that its manifest lists (when it has
    one): an index naming ``../elsewhere.safetensors`` is refused."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index_path} is not a valid safetensors index: {exc}") from exc
        for name in names:
            require_listed(directory, name, index_path)
        files = [directory / name for name in names]
    else:
        files = [directory / WEIGHTS_FILE]
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"weight file {path} is missing")
    return files


def read_safetensors(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file; a truncated or corrupt file raises CheckpointError."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"weight file {path} is truncated or corrupt: {exc}") from exc


def load_state_dict_strict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str,
                           *, assign: bool = False) -> None:
    """Load ``state_dict`` into ``model`` after checking names and shapes.

    Raises CheckpointError naming ``source`` (a file or directory) for missing or
    unexpected tensor names and for shape mismatches (with both shapes).
    """
    expected = model.state_dict()
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {_preview(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {_preview(unexpected)}")
        raise CheckpointError(f"{source} does not match the model config: {'; '.join(parts)}")
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{source}: tensor {name} has shape {list(tensor.shape)}, "
                                  f"the model expects {list(expected[name].shape)}")
    model.load_state_dict(dict(state_dict), strict=True, assign=assign)


def _preview(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} (and {len(names) - limit} more)"
