"""Native checkpoint directories: ``save_pretrained`` and ``load_pretrained``.

A directory holds config.json, safetensors weights and tokenizer files
(:mod:`astrai_core.checkpoints.native_files`); a LoRA training checkpoint holds an
adapter on a base (:mod:`astrai_core.checkpoints.lora_files`).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from astrai_core.checkpoints import lora_files
from astrai_core.checkpoints.hf_model import is_transformers_checkpoint, load_transformers_model
from astrai_core.checkpoints.manifest import hash_by_default, verify_manifest, write_manifest
from astrai_core.checkpoints.native_files import (
    INDEX_FILE,
    atomic_directory,
    copy_tokenizer_files,
    load_config,
    load_state_dict_strict,
    read_safetensors,
    weight_files,
    write_config,
    write_weights,
)
from astrai_core.errors import CheckpointError
from astrai_core.model.decoder import CausalLM
from astrai_core.model.lora import merged_state_dict

__all__ = ["load_pretrained", "load_state_dict_strict", "save_pretrained"]


def save_pretrained(model: CausalLM, directory: str | os.PathLike, *,
                    tokenizer_dir: str | os.PathLike | None = None,
                    max_shard_bytes: int = 2 * 1024**3, overwrite: bool = False) -> Path:
    """Write ``model`` as a native checkpoint directory; returns its path (a LoRA model is
    written merged: a plain checkpoint of what it computes)."""
    target = Path(directory)
    if target.exists() and not overwrite:
        raise CheckpointError(f"{target} already exists (pass overwrite=True to replace it)")
    if tokenizer_dir is not None and not Path(tokenizer_dir).is_dir():
        raise CheckpointError(f"tokenizer directory {tokenizer_dir} does not exist")
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with atomic_directory(target, lambda: weights) as staging:
        write_config(model.config, staging)
        write_weights(merged_state_dict(model), staging, max_shard_bytes)  # LoRA: merged
        if tokenizer_dir is not None:
            copy_tokenizer_files(Path(tokenizer_dir), staging)
        write_manifest(staging)  # last: it records every file above
    return target


def load_pretrained(directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None,
                    hashes: bool | None = False) -> CausalLM:
    """Load a native checkpoint directory into a CausalLM (weights via safetensors only);
    a checkpoint of a transformers-backend run (a Hugging Face directory with a manifest)
    into a :class:`~astrai_core.model_backends.transformers_lm.TransformersCausalLM`.

    A LoRA training checkpoint (``adapter/``) gives its base with the adapter applied
    (:func:`astrai_core.checkpoints.lora_files.load_lora_checkpoint`).

    Every file's size is checked against the checkpoint's ``manifest.json`` first, and
    with ``hashes`` its sha256 (a native LoRA checkpoint's recorded base's too; None: of
    each directory that is small, see ``manifest.hash_by_default``): hashing a large
    model on each load is slow."""
    directory = Path(directory)
    if is_transformers_checkpoint(directory):  # a Hugging Face directory and run state
        verify_manifest(directory, hashes=hash_by_default(directory, hashes))
        load_hf = partial(load_transformers_model, dtype=dtype, device=device)
        if lora_files.is_lora_checkpoint(directory):  # base: this directory, or recorded
            return lora_files.load_lora_checkpoint(directory, load_hf, load_hf)
        return load_hf(directory)
    verify_checkpoint(directory, hashes=hash_by_default(directory, hashes))
    load_plain = partial(_load_plain, dtype=dtype, device=device)
    if lora_files.is_lora_checkpoint(directory):  # the base may be LoRA too
        load_base = partial(load_pretrained, dtype=dtype, device=device, hashes=hashes)
        return lora_files.load_lora_checkpoint(directory, load_plain, load_base)
    return load_plain(directory)


def verify_checkpoint(directory: Path, *, hashes: bool = False) -> None:
    """A native checkpoint directory whose files match its manifest (``hashes``: sha256
    too, else sizes); CheckpointError naming the directory or file otherwise."""
    load_config(directory)  # JSON only: a clear message when it is not a checkpoint at all
    verify_manifest(directory, hashes=hashes)


def _load_plain(directory: Path, *, dtype: torch.dtype | None,
                device: torch.device | str | None) -> CausalLM:
    config = load_config(directory)
    files = weight_files(directory)
    state_dict: dict[str, torch.Tensor] = {}
    for path in files:
        state_dict.update(read_safetensors(path, device or "cpu"))
    if dtype is not None:
        state_dict = {name: t.to(dtype) for name, t in state_dict.items()}
    with torch.device("meta"):
        model = CausalLM(config)
    source = str(files[0]) if len(files) == 1 else str(directory / INDEX_FILE)
    load_state_dict_strict(model, state_dict, source, assign=True)
    return model.eval()
