"""One rank of the end-to-end check: a native model fully_shard'ed per decoder layer and at
the root, trained with build_optimizer's Muon + AdamW through real FSDP2 backwards, against
the same model unsharded in the same process. Every rank feeds the same batch, so the
averaged sharded gradients equal the single-process ones. A third copy, sharded too, runs
with activation checkpointing (each layer's recompute all-gathers it again)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import init_device_mesh

from astrai_core.config.trainer import TrainerConfig
from astrai_core.model import CausalLM, ModelConfig, enable_activation_checkpointing
from astrai_core.training.optim import build_optimizer
from tests.distributed.worker_kit import run_worker, write_rank_result

# Odd row counts: k/v 8 x 24 divide, gate/up 45 x 24 and the 41-token embedding do not.
CONFIG = dict(vocab_size=41, hidden_size=24, intermediate_size=45, num_layers=2, num_heads=3,
              num_kv_heads=1, head_dim=8, qk_norm=True)
TRAINER = TrainerConfig(max_steps=4, lr=1e-2, optimizer="muon", weight_decay=0.1)


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)["logits"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def max_diff(sharded: torch.nn.Module, reference: torch.nn.Module) -> float:
    full = {n: p.detach().full_tensor() for n, p in sharded.named_parameters()}
    return max((full[n] - p).abs().max().item() for n, p in reference.named_parameters())


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    reference = CausalLM(ModelConfig(**CONFIG)).train()
    sharded, checkpointed = copy.deepcopy(reference), copy.deepcopy(reference)
    enable_activation_checkpointing(checkpointed)
    for model in (sharded, checkpointed):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    layer_calls = [0]
    for layer in checkpointed.layers:  # counts forwards and recomputes (a pre-hook: see below)
        layer.register_forward_pre_hook(lambda *_: layer_calls.__setitem__(0, layer_calls[0] + 1))
    models = (reference, sharded, checkpointed)
    optimizers = [build_optimizer(list(m.named_parameters()), TRAINER) for m in models]
    diffs, checkpointed_diffs, losses = [], [], []
    for step in range(TRAINER.max_steps):
        ids = torch.randint(0, 41, (2, 9), generator=torch.Generator().manual_seed(step))
        for model, optimizer in zip(models, optimizers, strict=True):
            loss = loss_of(model, ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if model is not checkpointed:
                losses.append(loss.item())
        diffs.append(max_diff(sharded, reference))
        checkpointed_diffs.append(max_diff(checkpointed, reference))
    # The recompute stops early, so a post-hook would miss it; a pre-hook sees it start.
    result = {"diffs": diffs, "checkpointed_diffs": checkpointed_diffs, "losses": losses,
              "layer_calls_per_step": layer_calls[0] / TRAINER.max_steps}
    write_rank_result(out_dir, dist.get_rank(), result)


if __name__ == "__main__":
    run_worker(main)
