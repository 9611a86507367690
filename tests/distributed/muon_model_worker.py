"""One rank of the end-to-end check: a native model fully_shard'ed per decoder layer and at
the root, trained with build_optimizer's Muon + AdamW through real FSDP2 backwards, against
the same model unsharded in the same process. Every rank feeds the same batch, so the
averaged sharded gradients equal the single-process ones."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import init_device_mesh

from astrai_core.config.trainer import TrainerConfig
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.training.optim import build_optimizer

# Odd row counts: k/v 8 x 24 divide, gate/up 45 x 24 and the 41-token embedding do not.
CONFIG = dict(vocab_size=41, hidden_size=24, intermediate_size=45, num_layers=2, num_heads=3,
              num_kv_heads=1, head_dim=8, qk_norm=True)
TRAINER = TrainerConfig(max_steps=4, lr=1e-2, optimizer="muon", weight_decay=0.1)


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)["logits"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    reference = CausalLM(ModelConfig(**CONFIG)).train()
    sharded = copy.deepcopy(reference)
    for layer in sharded.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    optimizers = [build_optimizer(list(m.named_parameters()), TRAINER) for m in (reference, sharded)]
    diffs, losses = [], []
    for step in range(TRAINER.max_steps):
        ids = torch.randint(0, 41, (2, 9), generator=torch.Generator().manual_seed(step))
        for model, optimizer in zip((reference, sharded), optimizers, strict=True):
            loss = loss_of(model, ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        full = {n: p.detach().full_tensor() for n, p in sharded.named_parameters()}
        diffs.append(max((full[n] - p).abs().max().item() for n, p in reference.named_parameters()))
    result = {"diffs": diffs, "losses": losses}
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
