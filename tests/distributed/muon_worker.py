"""One rank of the sharded-Muon check, run by tests/distributed/test_muon_sharded.py under
``python -m torch.distributed.run --nproc-per-node 2``.

Every rank holds a fully_shard'ed module and, beside it, a plain full copy stepped by
``torch.optim.Muon`` (the reference; each expert of a 3-D tensor is its own parameter
there). Both get the same gradients each step. The rank writes the largest difference per
step, the shapes Newton–Schulz ran on, and the result of a DCP save/load of the optimizer.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

from astrai_core.training import muon as muon_module
from tests.distributed.worker_kit import run_worker, write_rank_result

# Rows not divisible by 2 (5, 9, 3 experts), one matrix whose second shard is empty (1 row),
# a tall one (9 x 3) and two 3-D expert stacks (one splits 2/2, one 2/1).
SHAPES = {"even": (6, 8), "uneven": (5, 7), "one_row": (1, 4), "tall": (9, 3),
          "wide": (4, 10), "experts": (4, 6, 5), "odd_experts": (3, 4, 2)}
STEPS = 5
SETTINGS = dict(lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr_fn="match_rms_adamw")


class Weights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name, shape in SHAPES.items():
            self.register_parameter(name, nn.Parameter(torch.randn(shape)))


def reference_params(module: Weights) -> dict[str, list[nn.Parameter]]:
    """Plain full copies: one matrix per 2-D weight, one per expert of a 3-D weight."""
    out = {}
    for name, param in module.named_parameters():
        full = param.detach().full_tensor()
        out[name] = [nn.Parameter(m.clone()) for m in full] if full.ndim == 3 else [nn.Parameter(full)]
    return out


def set_grads(module: Weights, ref: dict[str, list[nn.Parameter]], step: int, mesh) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for name, param in module.named_parameters():
        grad = torch.randn(SHAPES[name], generator=generator)
        param.grad = distribute_tensor(grad, mesh, [Shard(0)])
        for i, matrix in enumerate(ref[name]):
            matrix.grad = (grad[i] if grad.ndim == 3 else grad).clone()


def max_diff(module: Weights, ref: dict[str, list[nn.Parameter]]) -> float:
    worst = 0.0
    for name, param in module.named_parameters():
        full = param.full_tensor()
        expected = torch.stack(list(ref[name])) if full.ndim == 3 else ref[name][0]
        worst = max(worst, (full - expected).abs().max().item())
    return worst


def build(mesh) -> tuple[Weights, muon_module.Muon]:
    torch.manual_seed(0)  # the same full weights on every rank
    module = Weights()
    fully_shard(module, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in module.parameters())
    return module, muon_module.Muon(module.parameters(), **SETTINGS)


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    calls: list[list[int]] = []
    real_ns = muon_module.newton_schulz

    def counting_ns(matrix, *args):
        calls.append([len(calls_per_step), *matrix.shape])
        return real_ns(matrix, *args)

    calls_per_step: list[int] = []
    muon_module.newton_schulz = counting_ns
    module, optimizer = build(mesh)
    ref = reference_params(module)
    reference = torch.optim.Muon([p for ps in ref.values() for p in ps], **SETTINGS)
    diffs = []
    for step in range(STEPS):
        set_grads(module, ref, step, mesh)
        optimizer.step()
        reference.step()
        calls_per_step.append(step)
        diffs.append(max_diff(module, ref))
        if step == 2:  # the state after 3 steps, saved with DCP
            dcp.save({"optim": get_optimizer_state_dict(module, optimizer)},
                     checkpoint_id=str(out_dir / "dcp"))
            saved = {n: p.detach().full_tensor() for n, p in module.named_parameters()}
    muon_module.newton_schulz = real_ns
    buffers_are_dtensors = all(isinstance(s["momentum_buffer"], DTensor)
                               for s in optimizer.state.values())

    # Resume from the DCP save into a fresh module + optimizer: steps 4-5 must repeat exactly.
    resumed, resumed_optimizer = build(mesh)
    with torch.no_grad():
        for name, param in resumed.named_parameters():
            param.copy_(distribute_tensor(saved[name], mesh, [Shard(0)]))
    state = {"optim": get_optimizer_state_dict(resumed, resumed_optimizer)}
    dcp.load(state, checkpoint_id=str(out_dir / "dcp"))
    set_optimizer_state_dict(resumed, resumed_optimizer, state["optim"])
    for step in range(3, STEPS):
        set_grads(resumed, reference_params(resumed), step, mesh)
        resumed_optimizer.step()
    resume_diff = max((a.full_tensor() - b.full_tensor()).abs().max().item()
                      for a, b in zip(resumed.parameters(), module.parameters(), strict=True))
    result = {"shapes": list(SHAPES.values()), "diffs": diffs, "calls": calls, "resume_diff": resume_diff,
              "buffers_are_dtensors": buffers_are_dtensors}
    write_rank_result(out_dir, rank, result)


if __name__ == "__main__":
    run_worker(main)
