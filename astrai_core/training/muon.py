"""Muon that orthogonalizes whole matrices, on plain tensors and on FSDP2-sharded ones.

On plain tensors (one process) a step is exactly ``torch.optim.Muon``'s: the same
momentum (``lerp``), Nesterov blend, Newton–Schulz iteration in bf16, decoupled weight
decay and lr adjustment, op for op, so the numbers are bit-identical.

Under FSDP2 a parameter is a DTensor sharded on dim 0 (``Shard(0)``; the last shard may
be shorter, or empty). Momentum is elementwise, so it is kept and updated on the local
shard (the buffer is a DTensor sharded like the parameter, which is what
``torch.distributed.checkpoint`` saves and reshards). Newton–Schulz is not elementwise:
it must see the whole matrix. Each step therefore

1. assigns every sharded matrix to one owner rank of its shard group, greedily by size
   (largest first, to the least-loaded rank), the same on every rank;
2. sends each local shard of the Nesterov update, already in bf16 (Newton–Schulz's first
   act is a bf16 cast, so this is exact and halves the volume), to its owner: one
   ``all_to_all_single`` for all matrices of the group;
3. the owner concatenates the shards, runs Newton–Schulz once on the full matrix;
4. a second ``all_to_all_single`` returns each rank its rows of every result, and each
   rank applies weight decay and the update to its own shard.

So every matrix is orthogonalized exactly once per step per shard group, never on a
shard, and the update equals the single-process one. Under HSDP (a replicate × shard
mesh) each replica group does the same work on its identical copy.

3-D tensors (MoE experts fused as ``[E, out, in]``) are stacks of independent matrices:
each expert is orthogonalized on its own (one batched call per stack), with the lr
adjustment of its ``[out, in]`` shape. FSDP2 shards them on dim 0, the expert dim, so every expert is whole on one rank
and is orthogonalized there, without communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

try:  # torch.distributed may be built without DTensor support on some platforms
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover
    DTensor = None  # type: ignore[assignment,misc]

# Keller Jordan's quintic coefficients, as torch.optim.Muon uses them.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def newton_schulz(matrix: Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  steps: int = NS_STEPS, eps: float = EPS) -> Tensor:
    """The (approximate) orthogonalization of a 2-D ``matrix``, or of each matrix of a 3-D
    stack (batched: one call for all of a layer's experts), in bf16.

    The 2-D op sequence is torch.optim.Muon's, so the result is bit-identical to it; the
    3-D one is the same with batched matmuls."""
    if matrix.ndim not in (2, 3):
        raise ValueError(f"newton_schulz takes a matrix or a stack of them, got shape {tuple(matrix.shape)}")
    a, b, c = coefficients
    x = matrix.to(torch.bfloat16, copy=True)  # a copy even from bf16: div_ below is in place
    tall = matrix.size(-2) > matrix.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:
        x.div_(x.norm().clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
        multiply_add = torch.addmm
    else:
        x.div_(x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))
        multiply_add = torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """Muon's per-matrix lr scale for a ``[rows, cols]`` matrix (torch.optim.Muon's rule)."""
    rows, cols = shape[-2:]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


@dataclass
class _Pending:
    """A matrix sharded over a process group, waiting for its orthogonalized rows."""

    param: Tensor          # the local shard of the parameter
    update: Tensor         # the local shard of the Nesterov update, bf16 [local_rows, cols]
    rows: int              # the full matrix's rows
    group: dict[str, Any]  # its param group (lr, weight decay, NS settings)

    @property
    def cols(self) -> int:
        return self.update.shape[1]


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if DTensor is not None and isinstance(tensor, DTensor) else tensor


def _shard_group(param: Tensor) -> dist.ProcessGroup | None:
    """The process group a 2-D parameter's rows are sharded over (None: held whole here)."""
    if DTensor is None or not isinstance(param, DTensor):
        return None
    shard_dims = [i for i, p in enumerate(param.placements) if isinstance(p, Shard)]
    others = [p for p in param.placements if not isinstance(p, (Shard, Replicate))]
    if others or len(shard_dims) > 1 or any(param.placements[i].dim != 0 for i in shard_dims):
        raise ValueError(f"Muon supports parameters sharded on dim 0 (FSDP's Shard(0)) over one "
                         f"mesh dimension, got placements {param.placements}")
    if not shard_dims or param.device_mesh.size(shard_dims[0]) == 1:
        return None
    if param.ndim == 3:  # experts sharded on the expert dim: each local expert is whole
        return None
    return param.device_mesh.get_group(shard_dims[0])


def balance(sizes: list[int], ranks: int) -> list[int]:
    """An owner rank per matrix: largest first, each to the least-loaded rank (lowest on ties)."""
    loads = [0] * ranks
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner = min(range(ranks), key=lambda r: (loads[r], r))
        owners[index] = owner
        loads[owner] += sizes[index]
    return owners


class Muon(torch.optim.Optimizer):
    """Muon for 2-D hidden matrices (and 3-D stacks of them, batched), plain or FSDP2-sharded.

    Same arguments and defaults as ``torch.optim.Muon``; see the module docstring."""

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = EPS, ns_steps: int = NS_STEPS,
                 adjust_lr_fn: str | None = None) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("Muon: lr, momentum and weight_decay must be >= 0")
        if adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(f"Muon: adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")
        if not 0 < ns_steps < 100:
            raise ValueError("Muon: ns_steps must be between 1 and 99")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for param in group["params"]:
                if param.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices or 3-D stacks of them, "
                                     f"got a parameter of shape {tuple(param.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pending: dict[Any, list[_Pending]] = {}
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = self._momentum_update(param, group)
                process_group = _shard_group(param)
                if process_group is None:
                    self._apply_local(param, update, group)
                else:
                    pending.setdefault(process_group, []).append(_Pending(
                        _local(param), update.bfloat16(), param.shape[0], group))
        for process_group, items in pending.items():
            for item, ortho in zip(items, _orthogonalize_sharded(items, process_group), strict=True):
                _apply(item.param, ortho, item.group, (item.rows, item.cols))
        return loss

    def _momentum_update(self, param: Tensor, group: dict[str, Any]) -> Tensor:
        """Update the momentum buffer (on the local shard) and return the Nesterov blend."""
        if param.grad.is_sparse or torch.is_complex(param):
            raise RuntimeError("Muon supports dense real parameters only")
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
        grad, buf = _local(param.grad), _local(state["momentum_buffer"])
        momentum = group["momentum"]
        buf.lerp_(grad, 1 - momentum)
        return grad.lerp(buf, momentum) if group["nesterov"] else buf

    @staticmethod
    def _apply_local(param: Tensor, update: Tensor, group: dict[str, Any]) -> None:
        """The matrix (or every expert of a 3-D stack, in one batched call) is whole here."""
        local = _local(param)
        _apply(local, _ns(update, group), group, tuple(local.shape[-2:]))


def _ns(matrix: Tensor, group: dict[str, Any]) -> Tensor:
    # Looked up as a module global at call time, so tests can count the calls.
    return newton_schulz(matrix, group["ns_coefficients"], group["ns_steps"], group["eps"])


def _apply(param: Tensor, ortho: Tensor, group: dict[str, Any], shape: tuple[int, int]) -> None:
    lr = float(group["lr"])
    param.mul_(1 - lr * group["weight_decay"])
    param.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], shape))


def _orthogonalize_sharded(items: list[_Pending], group: dist.ProcessGroup) -> list[Tensor]:
    """Each rank's rows of the orthogonalized full matrices (bf16), in ``items`` order.

    Shards travel padded to ``ceil(rows / world)`` rows (FSDP2's chunking), so every
    shard of a matrix has one size."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = [-(-item.rows // world) for item in items]
    for item, chunk in zip(items, chunks, strict=True):
        expected = max(0, min(chunk, item.rows - rank * chunk))
        if item.update.shape[0] != expected:
            raise ValueError(f"Muon expects FSDP's dim-0 chunking: rank {rank} holds "
                             f"{item.update.shape[0]} of {item.rows} rows, not {expected}")
    owners = balance([item.rows * item.cols for item in items], world)
    sizes = [chunk * item.cols for chunk, item in zip(chunks, items, strict=True)]
    mine = [i for i in range(len(items)) if owners[i] == rank]
    per_source = sum(sizes[i] for i in mine)
    to_owner = [sum(sizes[i] for i in range(len(items)) if owners[i] == r) for r in range(world)]
    device = items[0].update.device

    # Forward: my padded shard of every matrix, grouped by owner rank.
    send = torch.cat([_padded(items[i].update, chunks[i]).reshape(-1)
                      for r in range(world) for i in range(len(items)) if owners[i] == r]
                     or [torch.empty(0, dtype=torch.bfloat16, device=device)])
    received = torch.empty(world * per_source, dtype=torch.bfloat16, device=device)
    _all_to_all(received, send, [per_source] * world, to_owner, group)

    # Newton–Schulz once per owned matrix, on the shards stacked back into the whole.
    blocks = received.view(world, per_source)
    back = torch.empty_like(blocks)
    offset = 0
    for i in mine:
        item, chunk, size = items[i], chunks[i], sizes[i]
        full = blocks[:, offset:offset + size].reshape(world * chunk, item.cols)[:item.rows]
        ortho = _ns(full, item.group)
        back[:, offset:offset + size] = _padded(ortho, world * chunk).reshape(world, size)
        offset += size

    # Return: every owner sends each rank its rows of the results.
    returned = torch.empty(sum(to_owner), dtype=torch.bfloat16, device=device)
    _all_to_all(returned, back.reshape(-1), to_owner, [per_source] * world, group)
    out: list[Tensor | None] = [None] * len(items)
    offset = 0
    for r in range(world):
        for i in (i for i in range(len(items)) if owners[i] == r):
            rows = items[i].update.shape[0]
            out[i] = returned[offset:offset + sizes[i]].view(chunks[i], items[i].cols)[:rows]
            offset += sizes[i]
    return out  # type: ignore[return-value]


def _padded(matrix: Tensor, rows: int) -> Tensor:
    if matrix.shape[0] == rows:
        return matrix.contiguous()
    padded = matrix.new_zeros(rows, matrix.shape[1])
    padded[:matrix.shape[0]] = matrix
    return padded


def _all_to_all(output: Tensor, input: Tensor, output_splits: list[int], input_splits: list[int],
                group: dist.ProcessGroup) -> None:
    dist.all_to_all_single(output, input, output_splits, input_splits, group=group)
