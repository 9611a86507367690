"""Weight pushes in buckets from sharded parameters (astrai_core.distributed.weight_gather):
on 1 and 2 processes (gloo), the buckets' concatenation equals the unsharded state bit for
bit (uneven shards included: 55 rows on 2 ranks), for loose tensors and for a model's push
state with an untied head, a tied head and a merged LoRA adapter; no bucket exceeds the
bound unless a single tensor does; delta pushes of the gathered buckets keep an unsharded
receiver bit-exact. See weight_gather_worker.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from astrai_core.distributed.weight_gather import Deferred, iter_full_buckets
from tests.distributed.conftest import run_torchrun

WORKER = Path(__file__).with_name("weight_gather_worker.py")
BOUNDS = {"tensors": 1024, "untied": 6000, "tied": 6000, "lora": 6000}  # the worker's


def test_buckets_of_plain_tensors_keep_order_and_bound():
    tensors = [(f"t{i}", torch.full((n,), float(i))) for i, n in enumerate([10, 20, 5, 100, 1, 3])]
    buckets = [dict(b) for b in iter_full_buckets(tensors, 100)]  # 4-byte floats: 25 per bucket
    assert [list(b) for b in buckets] == [["t0"], ["t1", "t2"], ["t3"], ["t4", "t5"]]
    assert all(torch.equal(b[n], t) for b in buckets for n, t in tensors if n in b)


def test_a_bucket_is_emptied_before_the_next_is_built():
    held: list[dict] = []
    seen: list[int] = []

    def make() -> torch.Tensor:
        seen.append(sum(len(b) for b in held))  # tensors the caller's buckets still hold
        return torch.zeros(10)

    stream = iter_full_buckets([(f"t{i}", Deferred((10,), torch.float32, make))
                                for i in range(3)], 40)  # 40-byte tensors: one per bucket
    held.append(next(stream))
    held.append(next(stream))
    assert seen == [0, 0] and not held[0] and list(held[1]) == ["t1"]


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="bucket_bytes"):
        next(iter_full_buckets([("t", torch.zeros(1))], 0))


@pytest.fixture(scope="module", params=[1, 2])
def ranks(request, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp(f"weight_gather{request.param}")
    run_torchrun(WORKER, str(out), nproc=request.param)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(request.param)]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BOUNDS))
def test_sharded_buckets_equal_the_unsharded_state(ranks, case):
    for rank in ranks:
        result = rank[case]
        assert result["names"] and result["equal"] and result["plain"], result
        bound = max(BOUNDS[case], result["largest"])
        assert all(size <= bound for size in result["sizes"]), result
        assert max(result["counts"]) > 1, result  # the bound groups tensors
        if case == "lora":
            assert result["merged_differs"]
        if case != "tensors":
            assert result["sharded"]  # DTensor parameters (a mesh of 1 or 2)


@pytest.mark.slow
def test_delta_pushes_from_shards_keep_an_unsharded_receiver_bit_exact(ranks):
    """Every rank gathers; the delta of the gathered buckets, applied to an unsharded copy,
    equals the unsharded model after each of 3 sparse edits, with fewer bytes sent."""
    for rank in ranks:
        result = rank["delta"]
        assert result["equal"] == [True, True, True], result
        assert result["sent"][0] == result["full"][0]  # the first push is whole
        assert all(0 < s < f / 2 for s, f in zip(result["sent"][1:], result["full"][1:])), result
