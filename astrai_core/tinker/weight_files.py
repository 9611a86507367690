"""A tenant's saved weights under the state dir: astrai's own files.

``<state_dir>/<model_id>/weights/<name>/`` (``save_weights``: to continue training):
``adapter.safetensors`` (the adapter, native names), ``optimizer.safetensors`` (AdamW's
moments and step counts), ``tinker_adapter.json`` (the adapter's shape and base), and
the manifest. ``…/sampler_weights/<name>/`` (``save_weights_for_sampler``): the same
adapter files plus ``adapter/``, the adapter in peft's format with Hugging Face module
names, which loads with peft on the Hugging Face base. Every directory is written aside
and renamed, its manifest last, and verified against that manifest when read.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from astrai_core.errors import AstraiError
from astrai_core.tinker.engine_types import EngineRequestError, LoraSpec
from astrai_core.tinker.unembed import MODULE as UNEMBED
from astrai_core.tinker.unembed import hf_module_name

ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
SPEC_FILE = "tinker_adapter.json"
PEFT_DIR = "adapter"
KINDS = ("weights", "sampler_weights")
CANONICAL = "default"  # the adapter name in files, whatever its slot in memory
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def canonical(name: str, slot: str) -> str:
    return name.replace(f".{slot}.", f".{CANONICAL}.")


def weights_key(model_id: str, name: str, for_sampler: bool) -> str:
    if not _NAME.match(name):
        raise EngineRequestError(f"checkpoint name {name!r}: use letters, digits, '.', '_' "
                                 "and '-' (up to 128, not starting with '.')")
    return f"{model_id}/{KINDS[for_sampler]}/{name}"


def key_directory(state_dir: Path, key: str) -> Path:
    """The directory of ``key`` (``<model_id>/<kind>/<name>``), which must lie inside
    ``state_dir`` and exist."""
    parts = key.strip("/").split("/")
    if len(parts) != 3 or parts[1] not in KINDS or any(p in ("", ".", "..") for p in parts):
        raise EngineRequestError(f"weights {key!r}: expected <model_id>/<weights|"
                                 "sampler_weights>/<name>", status=404)
    directory = state_dir.joinpath(*parts)
    if not (directory / SPEC_FILE).is_file():
        raise EngineRequestError(f"weights {key!r} not found", status=404)
    return directory


@dataclass
class PeftFiles:
    """An adapter to write in peft's format: its peft config and its tensors (native
    names) on ``model``, whose Hugging Face names ``model_type`` gives."""

    config: Any
    base_name: str
    model: Any
    model_type: str
    adapter: dict[str, torch.Tensor]

    def write(self, directory: Path) -> None:
        from safetensors.torch import save_file

        from astrai_core.checkpoints.lora_files import ADAPTER_WEIGHTS, PEFT_PREFIX, adapter_to_hf

        directory.mkdir()
        config = copy.copy(self.config)
        config.base_model_name_or_path = self.base_name
        layers = {k: v for k, v in self.adapter.items() if not k.startswith(f"{UNEMBED}.")}
        tensors = adapter_to_hf(self.model, self.model_type, layers) if layers else {}
        if len(layers) < len(self.adapter):  # the unembedding's LoRA, under the HF head's name
            head = hf_module_name(self.model)
            config.target_modules = set(config.target_modules or ()) | {head}
            for kind in ("lora_A", "lora_B"):
                tensors[f"{PEFT_PREFIX}{head}.{kind}.weight"] = (
                    self.adapter[f"{UNEMBED}.{kind}.{CANONICAL}.weight"].detach().contiguous().cpu())
        config.save_pretrained(str(directory))
        save_file(tensors, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def write_weights(target: Path, spec: LoraSpec, base_name: str, adapter: dict[str, torch.Tensor],
                  optimizer: dict[str, torch.Tensor] | None,
                  peft: PeftFiles | None = None) -> None:
    """Write one saved-weights directory at ``target`` (replacing an older one)."""
    from safetensors.torch import save_file

    from astrai_core.checkpoints.manifest import write_manifest
    from astrai_core.checkpoints.native_files import atomic_directory

    with atomic_directory(target) as staging:
        save_file({k: v.detach().contiguous().cpu() for k, v in adapter.items()},
                  str(staging / ADAPTER_FILE), metadata={"format": "pt"})
        if optimizer is not None:
            save_file({k: v.detach().contiguous().cpu() for k, v in optimizer.items()},
                      str(staging / OPTIMIZER_FILE), metadata={"format": "pt"})
        record = {"base_model": base_name, "lora": asdict(spec)}
        (staging / SPEC_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if peft is not None:
            peft.write(staging / PEFT_DIR)
        write_manifest(staging)


def read_weights(directory: Path, with_optimizer: bool
                 ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(the record, the adapter tensors, the optimizer tensors or None) of a directory
    written by :func:`write_weights`, checked against its manifest."""
    from astrai_core.checkpoints.manifest import verify_manifest
    from astrai_core.checkpoints.native_files import read_safetensors

    try:
        verify_manifest(directory)
        record = json.loads((directory / SPEC_FILE).read_text())
        adapter = read_safetensors(directory / ADAPTER_FILE)
        optimizer = None
        if with_optimizer:
            if not (directory / OPTIMIZER_FILE).is_file():
                raise EngineRequestError(f"{directory.name}: saved for sampling, without "
                                         "optimizer state; load it without the optimizer")
            optimizer = read_safetensors(directory / OPTIMIZER_FILE)
    except (AstraiError, ValueError, OSError) as exc:
        if isinstance(exc, EngineRequestError):
            raise
        raise EngineRequestError(f"weights {directory}: unreadable ({exc})") from None
    return record, adapter, optimizer


def spec_of(record: dict[str, Any]) -> LoraSpec:
    return LoraSpec(**record["lora"])
