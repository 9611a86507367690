"""The engine of a multi-process server on 2 gloo ranks, on a transformers-backend base
(phi3: fused qkv projections) sharded by FSDP2: each rank's share of the datums, the
gradients summed before a step and the gathered outputs equal the same calls on an
unsharded engine in the same process, within 1e-5."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from astrai_core.tinker.engine_types import AdamSpec, LoraSpec, SamplerTarget, SampleSpec
from tests.distributed.spawn_kit import spawn_checks
from tests.tinker.conftest import sft_datums


def _calls(engine, tenant_seed: int = 0) -> list:
    """Two steps on 3 datums, a forward of 1 (rank 1's share is empty), and a sample of
    the saved weights: every number the client would read."""
    engine.create_model("m", "hf", LoraSpec(rank=4, seed=tenant_seed))
    datums, _, _ = sft_datums()
    seen = []
    for _ in range(2):
        out = engine.forward_backward("m", datums, "cross_entropy")
        seen += [out.metrics["loss:sum"], *[o[k] for o in out.outputs for k in sorted(o)]]
        seen.append(engine.optim_step("m", AdamSpec(learning_rate=2e-2))["grad_norm:mean"])
    out = engine.forward("m", datums[:1], "cross_entropy")
    seen += [out.metrics["loss:sum"], out.outputs[0]["logprobs"]]
    key = engine.save_weights("m", "s", for_sampler=True)
    sample = engine.sample(SamplerTarget("hf", key), [1, 7, 9], 2, SampleSpec(max_tokens=4, seed=2))
    return seen + [s.tokens for s in sample.sequences] + [s.logprobs for s in sample.sequences]


def _check(rank: int, directory: str, state: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from astrai_core.distributed.context import DistContext
    from astrai_core.tinker.bases import load_base
    from astrai_core.tinker.engine import TorchEngine
    from astrai_core.tinker.ranks import MESH_DIM, shard_bases

    want = _calls(TorchEngine([load_base("hf", directory)], Path(state) / f"one-{rank}"))
    sharded = TorchEngine([load_base("hf", directory)], Path(state) / "two")
    context = DistContext(rank=rank, world_size=2,
                          mesh=init_device_mesh("cpu", (2,), mesh_dim_names=(MESH_DIM,)))
    shard_bases(sharded, context)
    sharded.dist = context
    sharded.writes_files = rank == 0
    # rank 1 samples from the files rank 0 wrote: it may read them only once they exist
    got = _calls(_after_save(sharded, dist))
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(g, list) and g and isinstance(g[0], int):
            assert g == w, f"value {index}: {g} vs {w}"
        else:
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                       rtol=0, atol=1e-5, err_msg=f"value {index}")


def _after_save(engine, dist):
    """``engine`` whose ``save_weights`` waits for every rank (rank 0 writes the files)."""
    save = engine.save_weights

    def saved(*args, **kwargs):
        key = save(*args, **kwargs)
        dist.barrier()
        return key
    engine.save_weights = saved
    return engine


def test_two_ranks_equal_one_on_a_transformers_base(tmp_path):
    from astrai_core.testing.hf_models import write_hf_model_dir

    directory = write_hf_model_dir(tmp_path / "phi3", "phi3")
    spawn_checks(tmp_path, _check, str(directory), str(tmp_path))
