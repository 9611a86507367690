"""Muon over the FSDP mesh: 2 CPU processes (gloo) under torch.distributed.run against
single-process torch.optim.Muon given the same parameters and gradients, and astrai's Muon
against torch.optim.Muon on plain tensors, bit for bit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from astrai_core.training.muon import Muon, balance, newton_schulz
from tests.distributed.conftest import run_torchrun

WORKER = Path(__file__).with_name("muon_worker.py")
MODEL_WORKER = Path(__file__).with_name("muon_model_worker.py")
SETTINGS = dict(lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr_fn="match_rms_adamw")


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("muon")
    run_torchrun(WORKER, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_sharded_muon_matches_torch_muon_over_five_steps(sharded_run):
    for rank in sharded_run:
        assert len(rank["diffs"]) == 5
        assert max(rank["diffs"]) <= 1e-6, rank["diffs"]
        assert rank["buffers_are_dtensors"]  # momentum is sharded like the parameters


def test_newton_schulz_runs_once_per_full_matrix_across_ranks(sharded_run):
    expected = Counter()
    for shape in sharded_run[0]["shapes"]:
        expected[tuple(shape[-2:])] += shape[0] if len(shape) == 3 else 1
    for step in range(5):
        seen = Counter()
        for call in (c for rank in sharded_run for c in rank["calls"] if c[0] == step):
            shape = call[1:]  # a 3-D call is one batched call for a rank's local experts
            seen[tuple(shape[-2:])] += shape[0] if len(shape) == 3 else 1
        assert seen == expected, (step, seen)  # never a shard's shape, never twice
    # Both ranks share the work (5 matrices are split, experts stay where they are).
    assert all(rank["calls"] for rank in sharded_run)


def test_optimizer_state_saved_with_dcp_resumes_exactly(sharded_run):
    assert all(rank["resume_diff"] == 0.0 for rank in sharded_run)


def test_fsdp_trained_native_model_equals_the_unsharded_one(tmp_path):
    # build_optimizer's Muon + AdamW on a model sharded per layer, real FSDP2 backwards,
    # with and without activation checkpointing.
    run_torchrun(MODEL_WORKER, str(tmp_path))
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert max(result["diffs"]) <= 1e-6, result["diffs"]
        assert max(result["checkpointed_diffs"]) <= 1e-6, result["checkpointed_diffs"]
        assert result["layer_calls_per_step"] == 4  # 2 layers, each run again in the backward
        sharded_losses, reference_losses = result["losses"][1::2], result["losses"][0::2]
        assert sharded_losses == pytest.approx(reference_losses, abs=1e-6)
        assert len(set(reference_losses)) == len(reference_losses)  # the weights moved


def test_owners_are_balanced_by_size():
    assert balance([10, 1, 1, 9], 2) == [0, 1, 0, 1]   # 10 + 1 | 9 + 1
    assert balance([4, 4, 4], 2) == [0, 1, 0]
    assert balance([3], 4) == [0]


def _pairs(shapes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ours = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return ours, theirs


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
def test_plain_tensors_equal_torch_muon_bit_for_bit(nesterov, adjust_lr_fn):
    ours, theirs = _pairs([(6, 8), (9, 3), (5, 5)])
    settings = dict(SETTINGS, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    ours_opt, theirs_opt = Muon(ours, **settings), torch.optim.Muon(theirs, **settings)
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        ours_opt.step()
        theirs_opt.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(ours_opt.state[a]["momentum_buffer"], theirs_opt.state[b]["momentum_buffer"])


def test_a_3d_stack_is_each_expert_orthogonalized_on_its_own():
    (stack,), _ = _pairs([(3, 4, 6)])
    experts = [torch.nn.Parameter(m.detach().clone()) for m in stack]
    ours_opt, theirs_opt = Muon([stack], **SETTINGS), torch.optim.Muon(experts, **SETTINGS)
    for step in range(3):
        stack.grad = torch.randn(stack.shape, generator=torch.Generator().manual_seed(step))
        for i, expert in enumerate(experts):
            expert.grad = stack.grad[i].clone()
        ours_opt.step()
        theirs_opt.step()
    assert torch.equal(stack.detach(), torch.stack([e.detach() for e in experts]))


def test_newton_schulz_orthogonalizes():
    matrix = torch.randn(16, 48, generator=torch.Generator().manual_seed(0))
    ortho = newton_schulz(matrix).float()
    singular = torch.linalg.svdvals(ortho)
    assert singular.min() > 0.5 and singular.max() < 1.5  # Muon's US'V^T, S' ~ U(0.5, 1.5)
    assert newton_schulz(matrix.T).shape == (48, 16)
    assert torch.equal(newton_schulz(matrix.T), newton_schulz(matrix).T)
    stack = torch.stack([matrix, 2 * matrix, matrix.flip(0)])  # batched = one by one
    assert torch.equal(newton_schulz(stack), torch.stack([newton_schulz(m) for m in stack]))


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="2-D matrices or 3-D"):
        Muon([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3))], adjust_lr_fn="bogus")
