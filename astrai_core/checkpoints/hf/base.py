"""The model-importer contract, and the base class that implements most of it.

A ``model_importer`` spec (``ModelImporterSpec(name=..., model_types=(...), target=...)``)
points at a class. ``astrai import``/``astrai export`` instantiate it without arguments
and call:

``import_checkpoint(src_dir, dst_dir) -> Path``
    Hugging Face checkpoint directory -> native checkpoint directory (written with
    :func:`astrai_core.model.save_pretrained`, so it appears only when complete).
``export_checkpoint(src_dir, dst_dir, *, model_type=None) -> Path``
    Native checkpoint -> HF directory that ``transformers.AutoModelForCausalLM``
    loads, written aside then renamed.
``config_from_hf(hf_config: dict) -> ModelConfig`` / ``config_to_hf(cfg, model_type=None) -> dict``
    Configuration both ways.
``weight_map(cfg, moe_layout="per_expert") -> list[TensorMap]``
    Tensor names both ways (see :mod:`astrai_core.checkpoints.hf.tensor_map`).

:class:`HFImporter` does the file handling, validation and the weight names shared by
the whole Llama/Mistral/Qwen family (HF ``model.layers.{i}.self_attn.q_proj.weight``
etc.). A subclass declares ``name``, ``model_types`` and ``architectures`` and
implements :meth:`HFImporter.fields_from_hf` and :meth:`HFImporter.fields_to_hf` for
its config spellings; an importer with MoE models also implements
:meth:`HFImporter.moe_map`.

The native checkpoint keeps what an exact export needs in ``hf_source.json``: the
source ``model_type``, the original HF ``config.json`` (and ``generation_config.json``)
and the on-disk expert layout. Export writes that original config back when the native
config still matches it, otherwise a fresh one from :meth:`HFImporter.config_to_hf`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from astrai_core.checkpoints.hf.files import (
    check_destination_free,
    read_hf_config,
    read_hf_weights,
    read_json,
    staged_directory,
    write_json,
)
from astrai_core.checkpoints.hf.source import (
    HF_SOURCE_FILE,
    default_model_type,
    read_hf_source,
    unsupported_model_type_message,
)
from astrai_core.checkpoints.hf.tensor_map import TensorMap, rename
from astrai_core.errors import CheckpointError
from astrai_core.log import get_logger

if TYPE_CHECKING:
    import torch

    from astrai_core.model import CausalLM, ModelConfig

GENERATION_CONFIG_FILE = "generation_config.json"
PER_EXPERT, FUSED = "per_expert", "fused"
EXPORT_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size
# Buffers some older checkpoints saved; they are recomputed from the config.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

log = get_logger(__name__)


class HFImporter:
    """Base of the built-in and plugin importers; see the module docstring."""

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    architectures: ClassVar[dict[str, str]] = {}  # model_type -> HF class in "architectures"

    # ------------------------------------------------------------------ config
    def config_from_hf(self, hf_config: dict[str, Any]) -> ModelConfig:
        """The native config of an HF ``config.json`` dict."""
        from pydantic import ValidationError

        from astrai_core.model import ModelConfig

        model_type = self.check_model_type(hf_config.get("model_type"))
        fields = self.fields_from_hf(hf_config, model_type)
        try:
            return ModelConfig(**fields)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
                                 for e in exc.errors())
            raise CheckpointError(f"config.json ({model_type}) cannot be represented by the native "
                                  f"decoder: {problems}") from None

    def config_to_hf(self, cfg: ModelConfig, model_type: str | None = None) -> dict[str, Any]:
        """A fresh HF ``config.json`` dict for ``cfg``; refuses what ``model_type`` cannot express."""
        model_type = self.check_model_type(model_type or self.default_model_type(cfg))
        hf_config = self.fields_to_hf(cfg, model_type)
        back = self.config_from_hf(hf_config)
        if back != cfg:
            differ = sorted(k for k in cfg.model_fields if getattr(back, k) != getattr(cfg, k))
            raise CheckpointError(f"this model cannot be exported as {model_type!r}: it differs in "
                                  f"{', '.join(differ)}")
        return hf_config

    def fields_from_hf(self, hf_config: dict[str, Any], model_type: str) -> dict[str, Any]:
        """ModelConfig keyword arguments from an HF config of ``model_type``."""
        raise NotImplementedError

    def fields_to_hf(self, cfg: ModelConfig, model_type: str) -> dict[str, Any]:
        """HF config dict of ``model_type`` for ``cfg``."""
        raise NotImplementedError

    def default_model_type(self, cfg: ModelConfig) -> str:
        """The ``model_type`` to export a model as when its checkpoint does not record one."""
        model_type = default_model_type(cfg)
        return model_type if model_type in self.model_types else self.model_types[0]

    def check_model_type(self, model_type: Any) -> str:
        if model_type not in self.model_types:
            raise CheckpointError(unsupported_model_type_message(
                model_type, f"importer {self.name!r} handles: {', '.join(self.model_types)}"))
        return model_type

    # ------------------------------------------------------------------ weights
    def weight_map(self, cfg: ModelConfig, moe_layout: str = PER_EXPERT) -> list[TensorMap]:
        """Every native tensor with its HF counterpart(s)."""
        maps = [rename("embed.weight", "model.embed_tokens.weight")]
        for layer in range(cfg.num_layers):
            maps += self.layer_map(cfg, layer, moe_layout)
        maps.append(rename("norm.weight", "model.norm.weight"))
        if not cfg.tie_word_embeddings:
            maps.append(rename("lm_head.weight", "lm_head.weight"))
        return maps

    def layer_map(self, cfg: ModelConfig, layer: int, moe_layout: str) -> list[TensorMap]:
        native, hf = f"layers.{layer}.", f"model.layers.{layer}."
        maps = [rename(native + "attn_norm.weight", hf + "input_layernorm.weight"),
                rename(native + "mlp_norm.weight", hf + "post_attention_layernorm.weight")]
        for proj in ("q", "k", "v", "o"):
            maps.append(rename(f"{native}attn.{proj}_proj.weight", f"{hf}self_attn.{proj}_proj.weight"))
        if cfg.attention_bias:
            for proj in ("q", "k", "v"):
                maps.append(rename(f"{native}attn.{proj}_proj.bias", f"{hf}self_attn.{proj}_proj.bias"))
        if cfg.qk_norm:
            for proj in ("q", "k"):
                maps.append(rename(f"{native}attn.{proj}_norm.weight", f"{hf}self_attn.{proj}_norm.weight"))
        if cfg.is_moe_layer(layer):
            return maps + self.moe_map(cfg, layer, moe_layout)
        return maps + dense_mlp_map(native + "mlp.", hf + "mlp.")

    def moe_map(self, cfg: ModelConfig, layer: int, moe_layout: str) -> list[TensorMap]:
        raise CheckpointError(f"importer {self.name!r} does not handle mixture-of-experts layers")

    def moe_layout_of(self, hf_names: set[str]) -> str:
        """How the HF checkpoint stores experts: one tensor per expert, or fused."""
        fused = any(name.endswith(".mlp.experts.gate_up_proj") for name in hf_names)
        return FUSED if fused else PER_EXPERT

    def state_dict_from_hf(self, cfg: ModelConfig, hf_tensors: dict[str, torch.Tensor],
                           expected: dict[str, tuple[int, ...]], source: str) -> dict[str, torch.Tensor]:
        """Native state dict from HF tensors, checking names and shapes first."""
        import torch

        maps = self.weight_map(cfg, self.moe_layout_of(set(hf_tensors)))
        consumed: set[str] = set()
        state: dict[str, torch.Tensor] = {}
        for tensor_map in maps:
            missing = [name for name in tensor_map.hf if name not in hf_tensors]
            if missing:
                raise CheckpointError(f"{source} has no tensor {missing[0]!r}, which its "
                                      "config.json requires (missing or incomplete weights?)")
            # expected HF shapes: convert empty native tensors of the expected shapes
            probes = [torch.empty(expected[name], device="meta") for name in tensor_map.native]
            for hf_name, probe in zip(tensor_map.hf, tensor_map.to_hf(probes), strict=True):
                found = tuple(hf_tensors[hf_name].shape)
                if found != tuple(probe.shape):
                    raise CheckpointError(f"{source}: tensor {hf_name!r} has shape {list(found)}, "
                                          f"the config implies {list(probe.shape)}")
            converted = tensor_map.to_native([hf_tensors[name] for name in tensor_map.hf])
            state.update(zip(tensor_map.native, converted, strict=True))
            consumed.update(tensor_map.hf)
        ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
        unexpected = sorted(name for name in set(hf_tensors) - consumed - ignorable
                            if not name.endswith(_IGNORED_SUFFIXES))
        if unexpected:
            more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
            raise CheckpointError(f"{source} has tensor {unexpected[0]!r}{more} that the native decoder "
                                  "has no place for (an unsupported architecture variant?)")
        return state

    def state_dict_to_hf(self, cfg: ModelConfig, state: dict[str, torch.Tensor],
                         moe_layout: str = PER_EXPERT) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for tensor_map in self.weight_map(cfg, moe_layout):
            converted = tensor_map.to_hf([state[name] for name in tensor_map.native])
            tensors.update(zip(tensor_map.hf, converted, strict=True))
        return tensors

    # ------------------------------------------------------------------ files
    def import_checkpoint(self, src_dir: str | os.PathLike, dst_dir: str | os.PathLike) -> Path:
        """HF directory -> native checkpoint directory (complete or absent)."""
        from astrai_core.checkpoints.manifest import write_manifest
        from astrai_core.checkpoints.native import save_pretrained
        from astrai_core.checkpoints.native_files import TOKENIZER_FILES

        src, dst = Path(src_dir), Path(dst_dir)
        check_destination_free(dst)
        hf_config = read_hf_config(src)
        hf_tensors = read_hf_weights(src)
        model = self.native_model(hf_config, hf_tensors, str(src))
        record = {"model_type": hf_config["model_type"], "importer": self.name,
                  "moe_layout": self.moe_layout_of(set(hf_tensors)), "config": hf_config}
        if (src / GENERATION_CONFIG_FILE).is_file():
            record["generation_config"] = read_json(src / GENERATION_CONFIG_FILE)
        if not any((src / name).is_file() for name in TOKENIZER_FILES):
            log.warning("no tokenizer files in the source; the checkpoint has none", source=str(src))
        with staged_directory(dst) as stage:
            save_pretrained(model, stage, tokenizer_dir=src)
            write_json(stage / HF_SOURCE_FILE, record)
            write_manifest(stage)  # again: it now holds hf_source.json too
        log.info("imported", source=str(src), destination=str(dst),
                 model_type=hf_config["model_type"], importer=self.name)
        return dst

    def native_model(self, hf_config: dict[str, Any], hf_tensors: dict[str, torch.Tensor],
                     source: str) -> CausalLM:
        """The native model holding the HF weights (in their dtype; no random init)."""
        import torch

        from astrai_core.checkpoints.native_files import load_state_dict_strict
        from astrai_core.model import CausalLM

        cfg = self.config_from_hf(hf_config)
        with torch.device("meta"):
            model = CausalLM(cfg)
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        state = self.state_dict_from_hf(cfg, hf_tensors, expected, source)
        load_state_dict_strict(model, state, source, assign=True)
        return model.eval()

    def export_checkpoint(self, src_dir: str | os.PathLike, dst_dir: str | os.PathLike, *,
                          model_type: str | None = None) -> Path:
        """Native checkpoint -> HF directory (complete or absent)."""
        from astrai_core.checkpoints.native import load_pretrained, verify_checkpoint
        from astrai_core.checkpoints.native_files import copy_tokenizer_files, write_weights

        src, dst = Path(src_dir), Path(dst_dir)
        check_destination_free(dst)
        verify_checkpoint(src, hashes=True)  # every byte: an export is what others will load
        model = load_pretrained(src)
        record = read_hf_source(src)
        model_type = self.check_model_type(model_type or record.get("model_type")
                                           or self.default_model_type(model.config))
        hf_config = self.export_config(model.config, record, model_type)
        from astrai_core.model.lora import merged_state_dict

        state = {name: t.detach() for name, t in merged_state_dict(model).items()}  # LoRA: merged
        tensors = self.state_dict_to_hf(model.config, state, record.get("moe_layout", PER_EXPERT))
        _record_dtype(hf_config, tensors)
        with staged_directory(dst) as stage:
            stage.mkdir()
            write_weights(tensors, stage, max_shard_bytes=EXPORT_SHARD_BYTES)
            write_json(stage / "config.json", hf_config)
            if "generation_config" in record:
                write_json(stage / GENERATION_CONFIG_FILE, record["generation_config"])
            copy_tokenizer_files(src, stage)
        log.info("exported", source=str(src), destination=str(dst), model_type=model_type)
        return dst

    def export_config(self, cfg: ModelConfig, record: dict[str, Any], model_type: str) -> dict[str, Any]:
        """The imported config verbatim when the model still matches it, else a fresh one."""
        original = record.get("config")
        if original and original.get("model_type") == model_type:
            try:
                if self.config_from_hf(original) == cfg:
                    return dict(original)
            except CheckpointError:
                pass
            log.warning("the model no longer matches the config it was imported from; writing "
                        "a fresh config.json", model_type=model_type)
        return self.config_to_hf(cfg, model_type)


def _record_dtype(hf_config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Say in the config which dtype the weights are (keeping the config's own key)."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        key = "torch_dtype" if "torch_dtype" in hf_config and "dtype" not in hf_config else "dtype"
        hf_config[key] = str(dtypes.pop()).removeprefix("torch.")


def dense_mlp_map(native_prefix: str, hf_prefix: str) -> list[TensorMap]:
    """SwiGLU gate/up/down, the same names on both sides (also the Qwen2-MoE shared expert)."""
    return [rename(f"{native_prefix}{proj}_proj.weight", f"{hf_prefix}{proj}_proj.weight")
            for proj in ("gate", "up", "down")]
