"""LoRA adapters on disk: PEFT's format with Hugging Face module names, and the base record.

``<dir>/adapter/`` holds ``adapter_config.json`` and ``adapter_model.safetensors`` exactly
as ``peft.PeftModel.save_pretrained`` writes them for the Hugging Face model
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), so
``PeftModel.from_pretrained(<astrai export of the base>, "<dir>/adapter")`` computes the
same logits. Native module names go to HF names through the model importer's own
tensor map; a tensor map that converts a weight on its way to HF (a per-head q/k row
permutation, were the native RoPE layout different) is applied to ``lora_B`` and the
DoRA magnitude too, whose rows are the weight's output rows. The native layout is HF's
rotate-half layout, so today every adapted weight maps by name only.

A checkpoint does not hold a second copy of the frozen base unless asked
(``model.lora.save_base``; a from-scratch base is always saved): ``lora_base.json``
records the base checkpoint's path (absolute, and relative to the checkpoint) and the
sha256 of its weight files, and loading checks that digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai_core.errors import CheckpointError
from astrai_core.model.lora import ADAPTER, adapter_parameters, has_lora, inject_lora

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_RECORD = "lora_base.json"
PEFT_PREFIX = "base_model.model."


# ---------------------------------------------------------------- the base

@dataclass(frozen=True)
class LoraBase:
    """Where a LoRA model's frozen base lives: a checkpoint directory and its digest."""

    path: Path
    sha256: str

    @classmethod
    def of(cls, directory: str | os.PathLike) -> LoraBase:
        directory = Path(directory).resolve()
        return cls(directory, weights_digest(directory))

    def record(self, checkpoint_dir: Path) -> dict[str, Any]:
        relative = os.path.relpath(self.path, checkpoint_dir.resolve())
        return {"path": str(self.path), "relative_path": relative, "sha256": self.sha256}


_DIGESTS: dict[tuple[str, int, int], str] = {}


def weights_digest(directory: Path) -> str:
    """sha256 over the weight files of a checkpoint (for a LoRA checkpoint: its adapter
    and its own base record). Read once per file version and cached."""
    from astrai_core.checkpoints.native_files import weight_files

    files = (weight_files(directory) if not (directory / ADAPTER_DIR).is_dir() else
             [directory / ADAPTER_DIR / ADAPTER_WEIGHTS, directory / BASE_RECORD])
    digest = hashlib.sha256()
    for path in files:
        if not path.is_file():  # a LoRA checkpoint that saved its base: no record file
            continue
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _DIGESTS:
            file_hash = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 24), b""):
                    file_hash.update(block)
            _DIGESTS[key] = file_hash.hexdigest()
        digest.update(path.name.encode() + b"\0" + _DIGESTS[key].encode())
    return digest.hexdigest()


def find_base(checkpoint_dir: Path) -> Path:
    """The base recorded by ``checkpoint_dir/lora_base.json``, its digest checked."""
    path = checkpoint_dir / BASE_RECORD
    try:
        record = json.loads(path.read_text())
        candidates = [checkpoint_dir / record["relative_path"], Path(record["path"])]
        expected = record["sha256"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is not a valid LoRA base record: {exc}") from None
    tried = []
    for candidate in candidates:
        if not candidate.is_dir():
            tried.append(f"{candidate} (missing)")
            continue
        found = weights_digest(candidate)
        if found == expected:
            return candidate
        tried.append(f"{candidate} (different weights: sha256 {found[:12]}..., "
                     f"expected {expected[:12]}...)")
    raise CheckpointError(f"{checkpoint_dir}: the LoRA adapter's base checkpoint was not found: "
                          f"tried {'; '.join(tried)}")


# ---------------------------------------------------------------- names

def module_maps(model: nn.Module, model_type: str) -> dict[str, Any]:
    """native module name -> (HF module name, the importer's TensorMap of its weight); a
    transformers model's modules already have their Hugging Face names."""
    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.hf.tensor_map import rename
    from astrai_core.checkpoints.hf_model import PREFIX
    from astrai_core.model.lora import lora_layers
    from astrai_core.model_backends.transformers_lm import is_transformers_model
    from astrai_core.plugins import process_registry

    if is_transformers_model(model):
        return {name: (name.removeprefix(PREFIX),
                       rename(f"{name}.weight", f"{name.removeprefix(PREFIX)}.weight"))
                for name, _ in lora_layers(model)}

    importer = load_importer(process_registry(), model_type=model_type)
    maps = {}
    for tensor_map in importer.weight_map(model.config):
        if len(tensor_map.native) == len(tensor_map.hf) == 1 and tensor_map.native[0].endswith(".weight"):
            maps[tensor_map.native[0].removesuffix(".weight")] = (
                tensor_map.hf[0].removesuffix(".weight"), tensor_map)
    return maps


def _split(name: str) -> tuple[str, str]:
    """``layers.0.attn.q_proj.lora_A.default.weight`` -> (module, PEFT tensor suffix)."""
    module, _, rest = name.partition(".lora_")
    kind = rest.split(".", 1)[0]  # A, B, magnitude_vector
    suffix = "lora_magnitude_vector" if kind == "magnitude_vector" else f"lora_{kind}.weight"
    return module, suffix


def _rows(tensor: torch.Tensor, tensor_map: Any, to_hf: bool) -> torch.Tensor:
    """Convert output rows like the weight's (identity for a plain rename)."""
    convert = tensor_map.to_hf if to_hf else tensor_map.to_native
    flat = tensor.unsqueeze(-1) if tensor.dim() == 1 else tensor
    out = convert([flat])[0]
    return out.squeeze(-1) if tensor.dim() == 1 else out


def adapter_to_hf(model: nn.Module, model_type: str,
                  adapter: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The adapter's tensors (``adapter``: by native name, whole; default: the model's own
    parameters) under PEFT's Hugging Face names."""
    maps = module_maps(model, model_type)
    tensors = {}
    for name, param in (adapter_parameters(model) if adapter is None else adapter).items():
        module, suffix = _split(name)
        if module not in maps:
            raise CheckpointError(f"adapted module {module!r} has no Hugging Face name under "
                                  f"model_type {model_type!r}")
        hf_module, tensor_map = maps[module]
        value = param.detach()
        if not suffix.startswith("lora_A"):
            value = _rows(value, tensor_map, to_hf=True)
        tensors[f"{PEFT_PREFIX}{hf_module}.{suffix}"] = value.contiguous().cpu()
    return tensors


def load_adapter_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], model_type: str,
                         source: str) -> None:
    """Copy PEFT-named tensors into ``model``'s adapter (every tensor present, shapes checked)."""
    maps = module_maps(model, model_type)
    params = adapter_parameters(model)
    expected = {}
    for name in params:
        module, suffix = _split(name)
        expected[f"{PEFT_PREFIX}{maps[module][0]}.{suffix}"] = name
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"{source} does not match the model's adapter: "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for hf_name, name in expected.items():
            param, value = params[name], tensors[hf_name]
            module, suffix = _split(name)
            if not suffix.startswith("lora_A"):
                value = _rows(value, maps[module][1], to_hf=False)
            if tuple(value.shape) != tuple(param.shape):
                raise CheckpointError(f"{source}: {hf_name} has shape {list(value.shape)}, the "
                                      f"adapter expects {list(param.shape)}")
            param.copy_(value)


# ---------------------------------------------------------------- files

def save_adapter(model: nn.Module, directory: Path, model_type: str,
                 base_name: str | None = None,
                 adapter: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``directory`` (adapter_config.json + adapter_model.safetensors); ``adapter``
    as in :func:`adapter_to_hf`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = model.peft_config[ADAPTER]
    config.base_model_name_or_path = base_name
    config.save_pretrained(str(directory))
    save_file(adapter_to_hf(model, model_type, adapter), str(directory / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    return directory


def read_adapter_config(directory: Path) -> Any:
    """peft's LoraConfig from ``directory/adapter_config.json`` (a LoRA adapter only)."""
    from peft import LoraConfig, PeftConfig

    path = directory / ADAPTER_CONFIG
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: not a PEFT adapter directory")
    try:
        config = PeftConfig.from_pretrained(str(directory))
    except Exception as exc:  # peft raises ValueError/TypeError/JSON errors
        raise CheckpointError(f"{path} is not a valid PEFT adapter config: {exc}") from None
    if not isinstance(config, LoraConfig):
        raise CheckpointError(f"{path} is a {type(config).__name__}, not a LoRA adapter")
    return config


def load_adapter(model: nn.Module, directory: Path, model_type: str) -> nn.Module:
    """Inject the adapter saved in ``directory`` (when the model has none) and load it."""
    from astrai_core.checkpoints.native_files import read_safetensors

    if not has_lora(model):
        config = read_adapter_config(directory)
        config.inference_mode = False
        inject_lora(model, config)
    weights = directory / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights} is missing")
    load_adapter_tensors(model, read_safetensors(weights), model_type, str(weights))
    return model


# ---------------------------------------------------------------- checkpoints

def model_type_of(directory: Path) -> str:
    """The HF model_type whose names a checkpoint's adapter uses (as `astrai export`; a
    Hugging Face directory's own)."""
    from astrai_core.checkpoints.hf.files import read_hf_config
    from astrai_core.checkpoints.hf.select import export_model_type
    from astrai_core.checkpoints.hf_model import is_hf_directory

    if is_hf_directory(directory):
        return str(read_hf_config(directory)["model_type"])
    return export_model_type(directory)


def saves_base(model: nn.Module) -> bool:
    """True when a checkpoint of ``model`` holds its base weights (a from-scratch base, or
    ``save_base``), False when it records where the base is."""
    return getattr(model, "lora_base", None) is None


def write_lora_weights(model: nn.Module, staging: Path, adapter: dict[str, torch.Tensor],
                       base_weights: dict[str, torch.Tensor] | None) -> None:
    """A LoRA model's part of a checkpoint: ``adapter/`` (``adapter``: the whole adapter
    tensors by native name), plus the base record, or ``base_weights`` (native names) as
    ``model.safetensors`` when :func:`saves_base`. ``staging`` already holds config.json
    and any hf_source.json."""
    from astrai_core.checkpoints.native_files import write_weights

    from astrai_core.checkpoints.hf_model import write_hf_files
    from astrai_core.model_backends.transformers_lm import is_transformers_model

    base: LoraBase | None = getattr(model, "lora_base", None)
    save_adapter(model, staging / ADAPTER_DIR, model_type_of(staging),
                 base_name=str(base.path) if base is not None else None, adapter=adapter)
    if base is None and is_transformers_model(model):
        write_hf_files(model, staging, base_weights)  # the family's names
    elif base is None:
        write_weights(base_weights, staging, max_shard_bytes=2 * 1024**3)
    else:  # staging is a sibling of the final directory: the relative path is the same
        (staging / BASE_RECORD).write_text(json.dumps(base.record(staging), indent=2) + "\n")


def is_lora_checkpoint(directory: Path) -> bool:
    return (directory / ADAPTER_DIR / ADAPTER_CONFIG).is_file()


def load_lora_checkpoint(directory: Path, load_plain: Any, load_base: Any) -> nn.Module:
    """Base (recorded, or saved alongside) + the checkpoint's adapter.

    ``load_plain(dir)``: loads a checkpoint directory's own weights (the base saved
    alongside); ``load_base(dir)``: loads a recorded base checkpoint (``load_pretrained``:
    a LoRA checkpoint itself, possibly)."""
    from astrai_core.model.lora import merge_and_unload

    saved_base = not (directory / BASE_RECORD).is_file()
    if saved_base:
        model, base = load_plain(directory), None
    else:
        base_dir = find_base(directory)
        model = merge_and_unload(load_base(base_dir))
        base = LoraBase(base_dir.resolve(), weights_digest(base_dir))
    load_adapter(model, directory / ADAPTER_DIR, model_type_of(directory))
    model.lora_base = base
    return model


def attach_lora(model: nn.Module, section: Any, base_dir: Path | None) -> nn.Module:
    """The run's policy with the ``model.lora`` adapter (``section``); ``base_dir``: the
    checkpoint ``model.path`` names (None: from scratch). A LoRA checkpoint as the base
    is merged first: the new adapter sits on its merged model."""
    from astrai_core.checkpoints.hf.source import default_model_type
    from astrai_core.model.lora import merge_and_unload, peft_lora_config

    model = merge_and_unload(model)
    if section.path is not None:
        model_type = model_type_of(base_dir) if base_dir is not None else default_model_type(model.config)
        load_adapter(model, Path(section.path), model_type)
    else:
        inject_lora(model, peft_lora_config(**_targets_of(model, section)))
    model.lora_base = None if base_dir is None or section.save_base else LoraBase.of(base_dir)
    return model


def _targets_of(model: nn.Module, section: Any) -> dict[str, Any]:
    """The adapter settings of ``section`` with ``target_modules`` in the model's own names
    (a transformers family's, :mod:`astrai_core.model_backends.lora_targets`); names it has
    no linear module for are left out, and none at all is an error naming the model type
    and the linear modules it has."""
    from astrai_core.log import get_logger
    from astrai_core.model_backends.lora_targets import (default_targets, family_targets,
                                                         linear_leaves, lora_scope,
                                                         scoped_targets)
    from astrai_core.model_backends.transformers_lm import is_transformers_model

    settings = section.adapter_settings()
    if not is_transformers_model(model):
        return settings
    head, scope = model.hf.get_output_embeddings(), lora_scope(model.hf)
    log = get_logger("astrai.lora")
    if section.target_modules is None:
        found, origin = default_targets(scope, model.model_type, settings["target_modules"], head)
        log.info("LoRA target modules", model_type=model.model_type, targets=found, chosen=origin)
    elif section.target_modules == "all-linear":
        found = linear_leaves(scope, head)
    else:
        found, missing = family_targets(scope, model.model_type, section.target_modules)
        if not found:
            raise CheckpointError(f"model.lora.target_modules: model_type {model.model_type!r} "
                                  f"has no linear module {', '.join(missing)} to adapt; its "
                                  f"linear modules: {', '.join(linear_leaves(scope, head))} "
                                  "(or all-linear)")
        if missing:
            log.warning("LoRA adapts no module for these target_modules: the family has no "
                        "linear module of that name", model_type=model.model_type,
                        skipped=missing)
    return {**settings, "target_modules": scoped_targets(model.hf, found)}
    if section.target_modules == "all-linear":
        return {**settings, "target_modules": linear_leaves(model.hf, head)}
    found, missing = family_targets(model.hf, model.model_type, section.target_modules)
    if not found:
        raise CheckpointError(f"model.lora.target_modules: model_type {model.model_type!r} "
                              f"has no linear module {', '.join(missing)} to adapt; its linear "
                              f"modules: {', '.join(linear_leaves(model.hf, head))} (or all-linear)")
    if missing:
        log.warning("LoRA adapts no module for these target_modules: the family has no "
                    "linear module of that name", model_type=model.model_type, skipped=missing)
    return {**settings, "target_modules": found}
