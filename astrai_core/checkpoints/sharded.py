"""The sharded half of a checkpoint: every trained module and its optimizer, saved with
``torch.distributed.checkpoint`` (DCP) in ``step_<N>/dcp/``.

Each rank writes its own shards; DCP's metadata records the global shapes, so the state
loads back on any number of ranks (a one-process run included: resharding is DCP's).
The same format is written by one-process runs, so they resume on N ranks too. The state
dicts come from ``torch.distributed.checkpoint.state_dict`` and are keyed by parameter
names (not positions), so they do not depend on how the modules are wrapped.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from astrai_core.distributed.context import DistContext
from astrai_core.errors import CheckpointError

DCP_DIR = "dcp"


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that a one-process save "assumes" one process: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is", category=UserWarning)
        yield


@contextlib.contextmanager
def _one_line(directory: Path) -> Iterator[None]:
    """DCP's failures while loading as one CheckpointError: its CheckpointException
    carries every rank's traceback (a BaseException, printed as pages)."""
    from astrai_core.checkpoints.safe_dcp import unwrap_failure

    try:
        yield
    except (CheckpointError, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as error:  # noqa: BLE001 - DCP's CheckpointException
        inner = unwrap_failure(error)
        if isinstance(inner, CheckpointError):
            raise inner from None
        first = (str(inner).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{directory / DCP_DIR}: cannot load the sharded state "
                              f"({type(inner).__name__}: {first})") from None


def _optimizers(optimizer: Any) -> list[Any]:
    """An optimizer group (Muon + AdamW) as its members, which DCP handles one by one."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def full_model_state(module: nn.Module, dist: DistContext) -> dict[str, Any]:
    """The whole (unsharded) state dict on rank 0, on the CPU; {} on the other ranks.
    A collective in a distributed run: every rank calls it."""
    if not dist.enabled:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(module, options=options)


def sharded_state(modules: list[Any]) -> dict[str, Any]:
    """{"modules": {name: state}, "optimizers": {name: state}} of the trained modules
    (objects with ``name``, ``module``, ``optimizer``), as this rank holds them.

    Frozen parameters are left out: they never change, and a resumed run rebuilds them
    from the model it starts from (a LoRA policy's base: the checkpoint holds only the
    adapter, not a second copy of the base)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    trained_only = StateDictOptions(ignore_frozen_params=True)
    return {"modules": {m.name: get_model_state_dict(m.module, options=trained_only)
                        for m in modules},
            "optimizers": {m.name: get_optimizer_state_dict(m.module, _optimizers(m.optimizer))
                           for m in modules}}


def save_sharded(directory: Path, modules: list[Any]) -> None:
    """Every rank's shards of ``modules`` into ``directory/dcp`` (a collective)."""
    import torch.distributed.checkpoint as dcp

    with _single_process_quiet():
        dcp.save(sharded_state(modules), checkpoint_id=str(directory / DCP_DIR),
                 no_dist=not _distributed())


def has_sharded(directory: Path) -> bool:
    return (directory / DCP_DIR / ".metadata").is_file()


def load_sharded(directory: Path, modules: list[Any]) -> None:
    """Restore ``modules`` and their optimizers from ``directory/dcp``, resharded to this
    run's mesh (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from astrai_core.checkpoints.safe_dcp import SafeLoadPlanner, SafeReader

    # the metadata, read and checked here: its errors are ours (DCP would log a failure
    # as a traceback and go on to look for per-rank metadata)
    saved = _saved_keys(directory)
    state = sharded_state(modules)
    # Partial: the template has optimizer state for every trainable parameter (DCP makes
    # it with a zero-lr step), the checkpoint only for those that ever had a gradient
    # (a critic's unused lm_head); AdamW skips the others, as the saved run did.
    with _single_process_quiet(), _one_line(directory):
        dcp.load(state, storage_reader=SafeReader(str(directory / DCP_DIR)),
                 no_dist=not _distributed(), planner=SafeLoadPlanner(allow_partial_load=True))
    for m in modules:
        # not strict: the state has no frozen parameters (see sharded_state)
        set_model_state_dict(m.module, state["modules"][m.name],
                             options=StateDictOptions(strict=False))
        set_optimizer_state_dict(m.module, _optimizers(m.optimizer),
                                 state["optimizers"][m.name])
        _drop_unsaved_state(m, saved)


def _saved_keys(directory: Path) -> set[str]:
    """The flattened keys the checkpoint holds (``optimizers.policy.state.<fqn>.<key>``)."""
    from astrai_core.checkpoints.safe_dcp import SafeReader

    return set(SafeReader(str(directory / DCP_DIR)).read_metadata().state_dict_metadata)


def _drop_unsaved_state(m: Any, saved: set[str]) -> None:
    """Forget the optimizer state the load template invented for parameters that had none
    when the checkpoint was written, so the resumed optimizer is the saved one exactly."""
    prefix = f"optimizers.{m.name}.state."
    for name, param in m.module.named_parameters():
        if not any(key.startswith(f"{prefix}{name}.") for key in saved):
            for optimizer in _optimizers(m.optimizer):
                optimizer.state.pop(param, None)


def read_sharded(directory: Path) -> dict[str, Any]:
    """The whole sharded state of a checkpoint as plain tensors, in this process (tools
    and tests: compare two runs' optimizer states)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from astrai_core.checkpoints.safe_dcp import SafeReader, SafeWholeLoadPlanner

    _saved_keys(directory)  # checked before DCP reads it (DCP logs its failures as pages)
    state: dict[str, Any] = {}
    with _one_line(directory):
        _load_state_dict(state, storage_reader=SafeReader(str(directory / DCP_DIR)),
                         planner=SafeWholeLoadPlanner(), no_dist=True)
    return state
