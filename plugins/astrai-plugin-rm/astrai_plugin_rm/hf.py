"""Reward models to and from Hugging Face ``AutoModelForSequenceClassification`` directories.

Export: the model importer of the checkpoint's ``model_type`` (the same one
``astrai export`` uses) writes the causal LM; its ``lm_head.weight`` is then replaced by
``score.weight`` and ``config.json`` names the ``*ForSequenceClassification`` class with
one label and the ``pad_token_id`` the scores pool by (see :mod:`astrai_plugin_rm.scoring`).
Import: the reverse, through the importer of the directory's ``model_type``. Both stage
their output beside the destination and rename it into place, so a destination that
exists is complete.

``astrai export`` of a reward-model checkpoint (one trained by strategy ``rm`` or written
by the import, both record the strategy) runs this same export: the strategy's spec names
it. Command line::

    python -m astrai_plugin_rm export RM_CHECKPOINT HF_DIR [--model-type llama]
    python -m astrai_plugin_rm import HF_DIR RM_CHECKPOINT [--importer NAME]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from astrai_core.api import (
    CheckpointError,
    export_model_type,
    load_importer,
    load_tokenizer,
    process_registry,
    read_hf_config,
    read_hf_weights,
    staged_directory,
    write_manifest,
    write_strategy_record,
)
from astrai_plugin_rm.checkpoint import SCORE_FILE, load_score_weight
from astrai_plugin_rm.scoring import reward_pad_id

STRATEGY = "rm"  # the strategy whose checkpoints these are (its spec names the exporter)
CAUSAL, CLASSIFIER = "ForCausalLM", "ForSequenceClassification"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_WEIGHT_FILES = (SINGLE_FILE, INDEX_FILE)


def export_reward_model(src: str | Path, dst: str | Path, *, model_type: str | None = None,
                        importer: str | None = None) -> Path:
    """A reward-model checkpoint -> a Hugging Face sequence-classifier directory ``dst``."""
    src, dst = Path(src), Path(dst)
    weight = load_score_weight(src)  # first: a checkpoint without a head fails at once
    pad_id = reward_pad_id(load_tokenizer(src))
    if pad_id is None:
        raise CheckpointError(f"{src}: the tokenizer has neither a pad nor an EOS token, so "
                              "the exported classifier could not find the last token")
    model_type = model_type or export_model_type(src)
    hf_importer = load_importer(process_registry(), name=importer, model_type=model_type)
    with staged_directory(dst) as stage:
        hf_importer.export_checkpoint(src, stage, model_type=model_type)
        _swap_tensor(stage, drop="lm_head.weight", add=("score.weight", weight))
        config = _read_json(stage / "config.json")
        config["architectures"] = [_renamed(a, CAUSAL, CLASSIFIER) for a in
                                   config.get("architectures") or [_architecture(model_type)]]
        config.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, pad_token_id=pad_id)
        config.pop("num_labels", None)  # transformers derives it from id2label
        _write_json(stage / "config.json", config)
    return dst


def import_reward_model(src: str | Path, dst: str | Path, *, importer: str | None = None) -> Path:
    """A Hugging Face sequence-classifier directory (one label) -> a reward-model checkpoint."""
    src, dst = Path(src), Path(dst)
    config = read_hf_config(src)
    architectures = config.get("architectures") or []
    if not any(a.endswith(CLASSIFIER) for a in architectures) or _num_labels(config) != 1:
        raise CheckpointError(f"{src / 'config.json'} is not a one-label sequence classifier "
                              f"(architectures {architectures}, {_num_labels(config)} labels)")
    tensors = read_hf_weights(src)
    weight = tensors.pop("score.weight", None)
    if weight is None or tensors.pop("score.bias", None) is not None:
        raise CheckpointError(f"{src}: expected a tensor 'score.weight' and no 'score.bias'")
    hf_importer = load_importer(process_registry(), name=importer,
                                model_type=config.get("model_type"))
    with staged_directory(dst) as stage:
        causal = stage.parent / "causal"  # the same weights, as the causal LM the importer reads
        causal.mkdir()
        lm_config = {k: v for k, v in config.items() if k not in ("id2label", "label2id")}
        lm_config["architectures"] = [_renamed(a, CLASSIFIER, CAUSAL) for a in architectures]
        # The classifier has no LM head: the native model ties it to the embeddings.
        lm_config["tie_word_embeddings"] = True
        _write_json(causal / "config.json", lm_config)
        _save(tensors, causal / SINGLE_FILE)
        for path in src.iterdir():  # tokenizer and generation files
            if path.is_file() and path.name not in ("config.json", *_WEIGHT_FILES) \
                    and path.suffix != ".safetensors":
                shutil.copy2(path, causal / path.name)
        hf_importer.import_checkpoint(causal, stage)
        _save({"weight": weight}, stage / SCORE_FILE)
        write_strategy_record(stage, STRATEGY)  # `astrai export` then finds our exporter
        write_manifest(stage)  # the score head belongs to the checkpoint too
    return dst


def _num_labels(config: dict[str, Any]) -> int:
    labels = config.get("id2label")
    return len(labels) if isinstance(labels, dict) else int(config.get("num_labels", 2))


def _renamed(architecture: str, old: str, new: str) -> str:
    return architecture[: -len(old)] + new if architecture.endswith(old) else architecture


def _architecture(model_type: str) -> str:
    names = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
             "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}
    return names.get(model_type, model_type.capitalize()) + CAUSAL


def _swap_tensor(directory: Path, *, drop: str, add: tuple[str, torch.Tensor]) -> None:
    """Remove ``drop`` from the directory's safetensors weights and add ``add`` (in the
    weights' dtype), in the file that held ``drop`` (one file or index + shards)."""
    from safetensors.torch import load_file

    index_path = directory / INDEX_FILE
    index = _read_json(index_path) if index_path.is_file() else None
    files = sorted(set(index["weight_map"].values())) if index else [SINGLE_FILE]
    target = index["weight_map"].get(drop, files[0]) if index else SINGLE_FILE
    for name in files:
        tensors = load_file(str(directory / name))
        if drop not in tensors and name != target:
            continue
        tensors.pop(drop, None)
        if name == target:
            dtype = next(t.dtype for t in tensors.values() if t.is_floating_point())
            tensors[add[0]] = add[1].to(dtype)
        _save(tensors, directory / name)
    if index:
        index["weight_map"].pop(drop, None)
        index["weight_map"][add[0]] = target
        _write_json(index_path, index)


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
