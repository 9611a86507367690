"""Training checkpoints: `<output_dir>/checkpoints/step_<N>/`.

Each is a native model checkpoint (config.json, model.safetensors, tokenizer files —
loadable by `load_pretrained`) plus what an exact resume needs: optimizer, scheduler,
RNG states, the strategy's state (data position, critic...) and the step. Everything
is written into a hidden staging directory that is renamed into place at the end, so
a directory named `step_<N>` is always complete.

Trained modules and their optimizer state go through torch.distributed.checkpoint
(``dcp/``, sharded per rank, loadable on any world size; see astrai_core.checkpoints.
sharded); schedulers, RNG and data positions through ``torch.save``.

Two files are pickles: ``training_state.pt`` and ``dcp/.metadata``. Neither is read
before the checkpoint's ``manifest.json`` (written last, before the rename) has verified
every file's size and sha256, and neither is read by a plain unpickler:
``training_state.pt`` goes through ``torch.load(weights_only=True)`` (PyTorch's restricted
unpickler: tensors, containers and plain values), ``dcp/.metadata`` through an unpickler
that builds only DCP's metadata classes (:mod:`astrai_core.checkpoints.safe_dcp`). A
manifest proves the files are the ones written, not who wrote them: a checkpoint from
someone else is as trustworthy as they are, but reading it runs none of its code.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from astrai_core.checkpoints import lora_files
from astrai_core.checkpoints.hf.source import HF_SOURCE_FILE
from astrai_core.checkpoints.hf_model import write_hf_files
from astrai_core.checkpoints.manifest import note_written, verify_manifest, write_manifest
from astrai_core.checkpoints.native_files import (
    atomic_directory,
    copy_tokenizer_files,
    directory_bytes,
    load_state_dict_strict,
    read_safetensors,
    weight_files,
    write_config,
    write_weights,
)
from astrai_core.checkpoints.sharded import full_model_state, save_sharded
from astrai_core.checkpoints.strategy_record import write_strategy_record
from astrai_core.distributed.context import SINGLE, DistContext
from astrai_core.distributed.fsdp import full_tensor
from astrai_core.errors import CheckpointError
from astrai_core.log import get_logger
from astrai_core.model.lora import adapter_parameters, base_state_dict, has_lora
from astrai_core.model_backends.transformers_lm import is_transformers_model
from astrai_core.checkpoints.write_phases import (DCP_WRITTEN, MANIFEST_WRITTEN,
                                                  TRAINING_STATE_WRITTEN, WEIGHTS_WRITTEN)

log = get_logger("astrai.checkpoints")

TRAINING_STATE = "training_state.pt"
STATE_TENSORS = "state_tensors.safetensors"  # tensors of the training state (a rollout)
TRAINER_JSON = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step_{step}"


def rng_state(backend: Any) -> dict[str, Any]:
    """Every generator a run draws from: python, torch CPU, and the device's own."""
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "device": backend.get_rng_state()}


def restore_rng_state(state: dict[str, Any], backend: Any) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    backend.set_rng_state(state["device"])


def save_checkpoint(target: Path, *, model: nn.Module, tokenizer_dir: Path,
                    extra_modules: dict[str, nn.Module], training_state: dict[str, Any],
                    summary: dict[str, Any], initial_model_dir: Path | None = None,
                    state_tensors: dict[str, torch.Tensor] | None = None,
                    sharded_modules: list[Any] = (), dist: DistContext = SINGLE,
                    phase_hook: Callable[[str, int], None] = lambda phase, step: None,
                    step: int = 0, strategy: str | None = None) -> Path:
    """Write one complete checkpoint directory atomically.

    ``initial_model_dir``: the checkpoint the run started from; its record of the original
    Hugging Face config (``hf_source.json``) travels along so `astrai export` stays exact.
    ``state_tensors``: tensors of the training state (the rollout being served), written
    through safetensors rather than inside ``training_state.pt``.
    ``sharded_modules``: the trained modules (``name``, ``module``, ``optimizer``) whose
    weights and optimizer state go to ``dcp/`` through torch.distributed.checkpoint.
    Distributed (``dist``): every rank calls this; each writes its shards, rank 0 writes
    the rest (the consolidated weights included) and renames the directory into place
    once every rank has finished. ``phase_hook(phase, step)`` is called after each part is
    written (:mod:`astrai_core.checkpoints.write_phases`), so tests can kill the run between them.
    ``strategy``: the strategy that trained it, recorded for `astrai export`
    (:mod:`astrai_core.checkpoints.strategy_record`).
    """
    # Gathered on rank 0 (collectives: all ranks). A LoRA policy saves only its adapter/,
    # so its full weights are not gathered at all (unless the checkpoint saves its base).
    lora = has_lora(model)
    weights = None if lora else full_model_state(model, dist)
    lora_weights = _full_lora_state(model, dist) if lora else None
    extra_weights = {name: full_model_state(module, dist)
                     for name, module in extra_modules.items()}
    with _staging(target, dist, partial(phase_hook, MANIFEST_WRITTEN, step)) as staging:
        if sharded_modules:
            save_sharded(staging, list(sharded_modules))
            phase_hook(DCP_WRITTEN, step)
        if not dist.is_main:
            return target
        if is_transformers_model(model):  # a Hugging Face directory, the family's names
            write_hf_files(model, staging, weights)
        else:
            write_config(model.config, staging)
            if weights is not None:
                write_weights(weights, staging, max_shard_bytes=2 * 1024**3)
        if weights is not None:
            phase_hook(WEIGHTS_WRITTEN, step)
        copy_tokenizer_files(tokenizer_dir, staging)
        if initial_model_dir is not None and (initial_model_dir / HF_SOURCE_FILE).is_file():
            shutil.copy2(initial_model_dir / HF_SOURCE_FILE, staging / HF_SOURCE_FILE)
        if lora:  # adapter/ in PEFT format (+ the base record); after hf_source
            lora_files.write_lora_weights(model, staging, *lora_weights)
        for name, state in extra_weights.items():
            save_file(_unshared(state), str(staging / f"{name}.safetensors"))
        if state_tensors:
            save_file({k: v.detach().cpu().contiguous() for k, v in state_tensors.items()},
                      str(staging / STATE_TENSORS))
        torch.save(training_state, staging / TRAINING_STATE)
        (staging / TRAINER_JSON).write_text(json.dumps(summary, indent=2) + "\n")
        if strategy is not None:
            write_strategy_record(staging, strategy)
        phase_hook(TRAINING_STATE_WRITTEN, step)
    return target


def _full_lora_state(model: nn.Module, dist: DistContext
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(the whole adapter tensors, the base weights or None when the checkpoint records
    its base) of a LoRA policy, on every rank: under FSDP2 each parameter is a DTensor
    shard, gathered here by every rank (collectives) before rank 0 writes."""
    adapter = {name: full_tensor(param.detach())
               for name, param in adapter_parameters(model).items()}
    if not lora_files.saves_base(model):
        return adapter, None
    return adapter, base_state_dict(model, full_model_state(model, dist))


@contextmanager
def _staging(target: Path, dist: DistContext, manifest_written: Any) -> Iterator[Path]:
    """Rank 0's staging directory for ``target``, shared with every rank; once every rank
    has written its part (barrier), rank 0 writes the manifest and renames the directory
    into place, and the ranks leave only once it is in place."""
    if dist.is_main:
        with atomic_directory(target, partial(_newest_size, target.parent)) as staging:
            dist.broadcast_object(str(staging))
            yield staging
            dist.barrier()  # every rank's shards are written
            write_manifest(staging)
            manifest_written()
        note_written(target)  # renamed; its manifest was just computed from these files
    else:
        yield Path(dist.broadcast_object(None))
        dist.barrier()
    dist.barrier()  # renamed: the checkpoint exists for every rank


def remove_stale_staging(output_dir: Path) -> list[Path]:
    """Delete the staging directories (``.step_N.tmp-*``) that a run killed while saving
    left in ``output_dir/checkpoints``; returns them. Only that pattern, only there."""
    root = output_dir / "checkpoints"
    stale = sorted(p for p in root.glob(".step_*.tmp-*") if p.is_dir()) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed an unfinished checkpoint", path=str(path))
    return stale


def _newest_size(root: Path) -> int:
    """The bytes of the newest checkpoint in ``root`` (what the next one will about need)."""
    kept = list_checkpoints(root.parent)
    return directory_bytes(kept[-1][1]) if kept else 0


def list_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first (staging directories are ignored)."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / TRAINING_STATE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def verified_checkpoints(output_dir: Path
                         ) -> tuple[list[tuple[int, Path]], list[tuple[int, Path, str]]]:
    """(the checkpoints whose manifest verifies, sizes and sha256, newest first;
    (step, path, why) of each other one). A checkpoint that fails is never read further."""
    good, failed = [], []
    for step, path in reversed(list_checkpoints(output_dir)):
        try:
            verify_manifest(path, hashes=True)
        except CheckpointError as exc:
            failed.append((step, path, str(exc)))
        else:
            good.append((step, path))
    return good, failed


def last_good_checkpoint(output_dir: Path) -> Path | None:
    """The newest checkpoint that verifies, or None."""
    good, _ = verified_checkpoints(output_dir)
    return good[0][1] if good else None


def latest_checkpoint(output_dir: Path, *, set_aside: bool = False) -> tuple[int, Path]:
    """(step, path) of the newest checkpoint that verifies, naming each newer one skipped
    and why; ``set_aside``: rename those to ``step_N.unverified-<id>`` (kept for a look,
    out of the run's way: the resumed run writes its own step_N). A clear error when none
    verifies."""
    good, failed = verified_checkpoints(output_dir)
    if not good:
        reasons = "".join(f"; {path.name}: {why}" for _, path, why in failed)
        raise CheckpointError(
            f"--resume: no complete checkpoint in {output_dir / 'checkpoints'} verifies"
            f"{reasons}; run without --resume to start from the beginning")
    for step, path, why in failed:
        if step <= good[0][0]:
            continue
        kept = ""
        if set_aside:
            aside = path.with_name(f"{path.name}.unverified-{uuid.uuid4().hex[:8]}")
            path.rename(aside)
            kept = f" (kept as {aside.name})"
        log.warning(f"--resume skips checkpoint {path.name}{kept}: {why}")
    return good[0]


def load_training_state(directory: Path) -> dict[str, Any]:
    """The pickled training state, through PyTorch's restricted unpickler (weights_only):
    tensors, containers and plain values only. Read after the manifest verified."""
    try:
        return torch.load(directory / TRAINING_STATE, map_location="cpu", weights_only=True)
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]  # torch's run on for pages
        raise CheckpointError(f"{directory / TRAINING_STATE}: cannot read training state "
                              f"({type(exc).__name__}: {first_line})") from None


def load_state_tensors(directory: Path) -> dict[str, torch.Tensor] | None:
    """The training state's tensors, or None when the checkpoint has none."""
    path = directory / STATE_TENSORS
    return load_file(str(path)) if path.is_file() else None


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Load a checkpoint's policy weights into the live ``model`` (names and shapes checked);
    a LoRA policy loads only its adapter (the base is frozen and already in place)."""
    if has_lora(model):
        lora_files.load_adapter(model, directory / lora_files.ADAPTER_DIR,
                                lora_files.model_type_of(directory))
        return
    state_dict: dict[str, torch.Tensor] = {}
    for path in weight_files(directory):
        state_dict.update(read_safetensors(path))
    load_state_dict_strict(model, state_dict, str(directory))


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state``'s tensors, each name on storage of its own: safetensors refuses two names
    on one storage (a module's tied head and embedding), so each name after the first
    gets a copy (loading writes the same values into the one tied tensor twice)."""
    seen: set[int] = set()
    out = {}
    for name, value in state.items():
        tensor = value.detach().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if storage in seen else tensor
        seen.add(storage)
    return out


def load_extra_modules(directory: Path, modules: dict[str, nn.Module]) -> None:
    for name, module in modules.items():
        path = directory / f"{name}.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: the checkpoint has no {name!r} weights")
        module.load_state_dict(load_file(str(path)))


def prune_checkpoints(output_dir: Path, keep_last: int | None) -> None:
    """Delete all but the newest ``keep_last`` checkpoints that verify (sizes and sha256;
    a file is hashed once per process unless it changes). One that does not verify is
    neither counted nor deleted: a corrupt newer checkpoint never costs an older good one,
    and the broken one stays for a look (``--resume`` sets it aside)."""
    if keep_last is None:
        return
    good, failed = verified_checkpoints(output_dir)
    for _, path, why in failed:
        log.warning(f"trainer.keep_last does not count checkpoint {path.name}: {why}")
    for _, path in good[keep_last:]:
        shutil.rmtree(path, ignore_errors=True)
