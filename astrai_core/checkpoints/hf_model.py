"""Transformers-backend models on disk: Hugging Face directories in, Hugging Face
directories out.

:func:`load_transformers_model` builds a :class:`~astrai_core.model_backends.
transformers_lm.TransformersCausalLM` from a Hugging Face directory: safetensors
weights only, and the directory's own model code (``auto_map``) only when
``trust_remote_code`` is on. :func:`write_hf_files` writes the model part of a run's
checkpoint as a Hugging Face directory (``config.json``, ``generation_config.json``,
safetensors with the family's own tensor names), so ``transformers`` loads a checkpoint
as it is and ``astrai export`` is a copy (:func:`copy_hf_checkpoint`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
import torch
from torch import nn

from astrai_core.checkpoints.hf.files import check_safetensors, read_json, staged_directory
from astrai_core.checkpoints.native_files import TOKENIZER_FILES, weight_files, write_weights
from astrai_core.errors import CheckpointError
from astrai_core.log import get_logger
from astrai_core.model_backends.transformers_lm import TransformersCausalLM

log = get_logger("astrai.hf_model")
PREFIX = "hf."  # the wrapper's name of the transformers model in state dicts
GENERATION_CONFIG = "generation_config.json"
# Marks a checkpoint written by a transformers-backend run: load_pretrained loads it
# through transformers (a Hugging Face directory without it is not an astrai checkpoint).
BACKEND_FILE = "astrai_backend.json"


def is_hf_directory(directory: Path) -> bool:
    """A Hugging Face checkpoint directory: a config.json with a model_type and no
    astrai format mark."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return False
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and "model_type" in config and "format" not in config


def is_transformers_checkpoint(directory: Path) -> bool:
    """A checkpoint of a transformers-backend run (see :data:`BACKEND_FILE`)."""
    return (Path(directory) / BACKEND_FILE).is_file()


def write_backend_record(model: nn.Module, directory: Path) -> None:
    """Mark ``directory`` as a transformers-backend checkpoint of ``model``."""
    record = {"backend": "transformers", "model_type": model.config.model_type}
    (Path(directory) / BACKEND_FILE).write_text(json.dumps(record, indent=2) + "\n")


def load_transformers_model(directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                            trust_remote_code: bool = False,
                            device: torch.device | str | None = None) -> TransformersCausalLM:
    """The Hugging Face directory's causal LM (or vision-language model) behind the native
    interface (eval mode)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from astrai_core.model_backends.vision import is_vision_language

    directory = Path(directory)
    auto = AutoModelForImageTextToText if is_vision_language(read_json(
        directory / "config.json")) else AutoModelForCausalLM
    check_safetensors(directory)
    if trust_remote_code:
        log.warning("model.trust_remote_code is on: running the model code shipped in the "
                    "directory, with your rights", directory=str(directory))
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # astrai's own log says what is loaded
    try:
        hf_model = auto.from_pretrained(
            str(directory), dtype=dtype or torch.float32, use_safetensors=True,
            trust_remote_code=trust_remote_code)
    except ValueError as exc:  # an unknown model_type, or code it would have to trust
        first = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{directory}: transformers cannot build this model: {first}"
                              ) from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if device is not None:
        hf_model = hf_model.to(device)
    return TransformersCausalLM(hf_model).eval()


def hf_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None
                  ) -> dict[str, torch.Tensor]:
    """The transformers model's tensors under its own names (a tied output head once, as
    ``save_pretrained`` writes it), from ``state`` (the wrapper's state dict, e.g.
    gathered from FSDP shards; default: the model's own)."""
    state = model.state_dict() if state is None else state
    tensors = {name.removeprefix(PREFIX): t for name, t in state.items()}
    if model.config.tie_word_embeddings:
        for name in output_head_names(model):
            tensors.pop(name, None)
    return tensors


def output_head_names(model: nn.Module) -> list[str]:
    """The family's names of the output head's weight (a tied head: the names that
    ``save_pretrained`` leaves out)."""
    hf = model.hf
    head = hf.get_output_embeddings()
    return [f"{name}.weight" for name, module in hf.named_modules() if module is head]


def write_hf_files(model: nn.Module, staging: Path, state: dict[str, torch.Tensor] | None
                   ) -> None:
    """``config.json``, ``generation_config.json`` and the weights (``state``: the
    wrapper's full state dict; None: no weights, a LoRA checkpoint records its base) of a
    Hugging Face directory into ``staging``."""
    hf = model.hf
    write_backend_record(model, staging)
    hf.config.save_pretrained(str(staging))
    generation = getattr(hf, "generation_config", None)
    if generation is not None:
        try:
            generation.save_pretrained(str(staging))
        except ValueError:  # a generation config transformers itself refuses to save
            pass
    if state is None:
        return
    tensors = hf_state_dict(model, state)
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    write_weights(tensors, staging, max_shard_bytes=5 * 1024**3)
    if len(dtypes) == 1:  # the config says which dtype the weights are, as transformers does
        config = read_json(staging / "config.json")
        config["dtype"] = str(dtypes.pop()).removeprefix("torch.")
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_hf_directory(model: nn.Module, directory: str | os.PathLike) -> Path:
    """A transformers-backend ``model`` as a plain Hugging Face directory (config,
    generation config, safetensors; a LoRA model merged), what an inference engine loads;
    written aside, then renamed."""
    from astrai_core.model.lora import merged_state_dict

    target = Path(directory)
    with staged_directory(target) as stage:
        stage.mkdir()
        write_hf_files(model, stage, merged_state_dict(model))
    return target


def copy_hf_checkpoint(src: Path, dst: Path) -> Path:
    """``astrai export`` of a transformers-backend checkpoint: its Hugging Face files
    (config, generation config, weights, tokenizer), without the training state."""
    from astrai_core.checkpoints.manifest import verify_manifest

    verify_manifest(src, hashes=True)
    names = ["config.json", GENERATION_CONFIG, *TOKENIZER_FILES]
    index = src / "model.safetensors.index.json"
    files = [src / name for name in names if (src / name).is_file()]
    files += weight_files(src) + ([index] if index.is_file() else [])
    with staged_directory(dst) as stage:
        stage.mkdir()
        for path in files:
            shutil.copy2(path, stage / path.name)
    return dst

