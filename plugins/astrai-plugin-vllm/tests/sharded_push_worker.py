"""One rank of the sharded-push check, run by test_vllm_sharded_push.py under
``python -m torch.distributed.run --nproc-per-node 2``.

For each model (untied head, tied head, LoRA, MoE) the rank builds the policy, takes the
Hugging Face tensors a one-process push hands vLLM (``hf_weights`` on the whole model),
shards a copy with FSDP2 and records whether the stream a sharded push hands vLLM (full
tensors gathered bucket by bucket, converted per bucket) holds the same names and
tensors, bit for bit. A tiny bucket puts every tensor in a bucket of its own, so tensor
groups (a layer's experts) always span buckets. ``push: delta`` from the shards: a whole
push, then a delta after some weights changed, into an engine stand-in (the real
extension's copy, its reload recorded) leave it holding the changed policy's tensors."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from astrai_core.api import (PER_EXPERT, iter_hf_push_buckets, iter_push_buckets, load_importer,
                             process_registry)
from astrai_core.distributed.context import DistContext
from astrai_core.distributed.fsdp import shard_module
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.lora import inject_lora
from astrai_plugin_vllm.colocated import hf_stream
from astrai_plugin_vllm.delta import DeltaPusher
from astrai_plugin_vllm.weights import WeightSyncExtension, hf_weights

CONFIG = dict(vocab_size=55, hidden_size=24, intermediate_size=40, num_layers=2, num_heads=3,
              num_kv_heads=1, head_dim=8, qk_norm=True)
CASES = {"untied": {}, "tied": {"tie_word_embeddings": True}, "lora": {},
         "moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}}


def build(case: str) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**CONFIG, **CASES[case]))
    if case == "lora":
        from peft import LoraConfig

        inject_lora(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        with torch.no_grad():  # B = 0 at init: move it so that the merge matters
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    return model


class StandInEngine(WeightSyncExtension):
    """The weight-sync extension without vLLM: its reload records what it was given."""

    loaded: dict[str, torch.Tensor] = {}

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        return [getattr(self, method)(*args)]

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        self.loaded = {name: tensor.clone() for name, tensor in weights_iterator}

    def get_model(self) -> torch.nn.Module:
        return torch.nn.Module()


def change_some(model: torch.nn.Module) -> None:
    """Scale the weights above 0.05 (a few per cent of them; DTensors element-wise)."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.where(param > 0.05, param * 1.5, param))


def delta_check(reference: torch.nn.Module, sharded: torch.nn.Module, importer) -> dict:
    """A whole push then a delta from the shards, as safetensors bytes (multiprocess)."""
    engine, pusher = StandInEngine(), DeltaPusher(multiprocess=True)
    pushes = [pusher.push(engine, iter_hf_push_buckets(sharded, 1, importer, PER_EXPERT), False)]
    change_some(reference)
    change_some(sharded)
    pushes.append(pusher.push(engine, iter_hf_push_buckets(sharded, 1, importer, PER_EXPERT),
                              False))
    expected = hf_weights(importer, reference, PER_EXPERT)
    (sent, full), (delta_sent, delta_full) = pushes
    mirror = engine._astrai_mirror().tensors
    return {"delta_equal": sorted(mirror) == sorted(expected) == sorted(engine.loaded)
            and all(torch.equal(mirror[n], t) and torch.equal(engine.loaded[n], t)
                    for n, t in expected.items()),
            "delta_smaller": sent == full == delta_full and 0 < delta_sent < full / 2}


def check(case: str, ctx: DistContext, importer) -> dict:
    reference = build(case)
    expected = hf_weights(importer, reference, PER_EXPERT)
    sharded = shard_module(copy.deepcopy(reference), ctx)
    got = [(name, tensor.clone()) for name, tensor in
           hf_stream(importer, sharded.config, iter_push_buckets(sharded, 1), PER_EXPERT)]
    return {"names": sorted(n for n, _ in got) == sorted(expected),
            "unique": len({n for n, _ in got}) == len(got),
            "equal": all(torch.equal(t, expected[n]) and t.dtype == expected[n].dtype
                         for n, t in got if n in expected),
            "sharded": any(hasattr(p, "full_tensor") for p in sharded.parameters()),
            "count": len(got), **delta_check(reference, sharded, importer)}


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), mesh=mesh)
    importer = load_importer(process_registry(), model_type="qwen3")
    results = {case: check(case, ctx, importer) for case in CASES}
    (out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown, which gloo sometimes aborts (signal 6)
