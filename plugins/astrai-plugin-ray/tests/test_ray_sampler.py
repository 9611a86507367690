"""The ray sampler against the local torch sampler, and its weight pushes, on a local Ray."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import SamplingParams
from astrai_plugin_ray.buckets import pack, plan_buckets, unpack
from astrai_plugin_ray.sampler import RaySampler, split_groups

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3], [2, 2, 7], [9, 1]]


def _tiny_model(seed: int = 0):
    from astrai_core.api import CausalLM, ModelConfig
    from astrai_core.testing import TINY_MODEL

    torch.manual_seed(seed)
    return CausalLM(ModelConfig(vocab_size=32, **TINY_MODEL))


@pytest.fixture(scope="module")
def sampler(ray_session):
    """Two workers of half a CPU each (another sampler fits beside them)."""
    model = _tiny_model()
    sampler = RaySampler(model=model, workers=2, worker_resources={"CPU": 0.5})
    yield sampler
    sampler.close()


def test_two_workers_give_the_local_samplers_completions(sampler):
    from astrai_core.sampling.torch_sampler import TorchSampler

    params = [SamplingParams(max_new_tokens=6, seed=10 + i, n=3, temperature=0.8 + 0.1 * i,
                             top_k=8 * (i % 2), stop_token_ids=(4,)) for i in range(len(PROMPTS))]
    remote = sampler.generate(PROMPTS, params)
    local = TorchSampler(sampler.model).generate(PROMPTS, params)
    assert len(remote) == 3 * len(PROMPTS)
    assert [c.prompt_index for c in remote] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]
    assert [c.finish_reason for c in remote] == [c.finish_reason for c in local]
    for mine, theirs in zip(remote, local):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    # both workers took part, each with whole groups
    assert {info["pid"] for info in sampler.worker_info} and len(sampler.worker_info) == 2


@pytest.mark.parametrize("name, interruptible", [("keyword_torch", False),
                                                 ("interruptible_keyword_torch", True)])
def test_workers_pass_the_interrupt_only_to_a_sampler_that_declares_it(ray_session, name,
                                                                        interruptible):
    """Both samplers' generate takes ``interrupt``; the declaration alone decides."""
    sampler = RaySampler(model=_tiny_model(), workers=1, worker_resources={"CPU": 0.5},
                         worker_sampler={"name": name})
    try:
        params = SamplingParams(max_new_tokens=3, seed=1)
        sent = sampler.generate_async(PROMPTS, params, interruptible=True).result()
        assert {c.text for c in sent} == ({"interrupt"} if interruptible else {""})
        assert {c.text for c in sampler.generate(PROMPTS, params)} == {""}
        assert sampler.capabilities.interruptible is interruptible  # what partial reads
    finally:
        sampler.close()


def test_update_weights_gives_every_worker_the_trainers_weights_exactly(sampler):
    model = sampler.model
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    version = sampler.policy_version
    assert sampler.update_weights() == version + 1
    metrics = sampler.metrics()
    assert metrics["rollout/weight_push_mb"] > 0 and metrics["rollout/weight_push_seconds"] >= 0
    expected = model.state_dict()
    for weights in sampler.worker_weights():
        assert weights.keys() == expected.keys()
        assert all(torch.equal(weights[k], expected[k]) for k in expected)
    # the pushed weights generate: the workers agree with the local sampler on them
    from astrai_core.sampling.torch_sampler import TorchSampler

    params = SamplingParams(max_new_tokens=5, seed=3, n=2)
    assert ([c.token_ids for c in sampler.generate(PROMPTS, params)]
            == [c.token_ids for c in TorchSampler(model).generate(PROMPTS, params)])


def test_only_trained_tensors_move_and_a_subset_can_be_pushed(sampler):
    """Frozen tensors (a LoRA base) are not pushed; a state-dict subset moves alone."""
    model = sampler.model
    frozen = [p for name, p in model.named_parameters() if "embed" in name]
    before = [w["model.embed_tokens.weight"].clone() if "model.embed_tokens.weight" in w else None
              for w in sampler.worker_weights()]
    try:
        for parameter in frozen:
            parameter.requires_grad_(False)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.5)
        sampler.update_weights()
        pushed_mb = sampler.metrics()["rollout/weight_push_mb"]
        trained = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
        assert pushed_mb == pytest.approx(trained / 2**20, rel=0.01)
        state = model.state_dict()
        for weights, old in zip(sampler.worker_weights(), before):
            for name, value in weights.items():
                if "embed" in name or "lm_head" in name and model.config.tie_word_embeddings:
                    continue
                assert torch.equal(value, state[name]), name
            if old is not None:
                assert torch.equal(weights["model.embed_tokens.weight"], old)  # not pushed
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)
    name = next(iter(state))
    subset = {name: torch.full_like(state[name], 0.25)}
    sampler.update_weights(subset)
    for weights in sampler.worker_weights():
        assert torch.equal(weights[name], subset[name])
    sampler.update_weights()  # back in step with the trainer for the other tests


def test_object_store_transport_when_no_group_is_formed(ray_session):
    model = _tiny_model(seed=1)
    sampler = RaySampler(model=model, workers=1, worker_resources={"CPU": 0.5},
                         weight_transport="object_store", bucket_mb=0.01)
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(-1.0)
        sampler.update_weights()
        assert sampler.metrics()["rollout/weight_push_mb"] > 0.01  # several buckets
        (weights,) = sampler.worker_weights()
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    finally:
        sampler.close()


def test_buckets_are_bounded_aligned_and_round_trip_every_dtype():
    tensors = {"a": torch.randn(3, 5), "b": torch.tensor([True, False, True]),
               "c": torch.randn(7).to(torch.bfloat16), "d": torch.arange(4),
               "big": torch.randn(100), "e": torch.randn(2, 2).half()}
    buckets = plan_buckets(tensors, limit_bytes=64)
    assert [e.name for b in buckets for e in b.entries] == list(tensors)
    for bucket in buckets:
        assert bucket.nbytes <= 64 or len(bucket.entries) == 1  # a big tensor travels alone
        assert all(entry.offset % 16 == 0 for entry in bucket.entries)
    out = {}
    for bucket in buckets:
        out.update(unpack(bucket, pack(bucket, tensors, torch.device("cpu")).clone()))
    assert all(torch.equal(out[k], v) and out[k].dtype == v.dtype for k, v in tensors.items())


def test_split_groups_keeps_runs_contiguous_and_balanced():
    assert split_groups([4] * 8, 2) == [0, 4, 8]
    assert split_groups([4] * 8, 3) == [0, 3, 5, 8]
    assert split_groups([1, 1, 1, 9], 2) == [0, 3, 4]
    assert split_groups([2], 3) == [0, 1, 1, 1]


def test_a_worker_that_cannot_start_is_named_with_its_cause(ray_session):
    from astrai_plugin_ray.workers import RolloutWorkerDied

    def placed() -> set[str]:
        table = ray_session.util.placement_group_table()
        return {key for key, group in table.items() if group["state"] != "REMOVED"}

    before = placed()
    with pytest.raises(RolloutWorkerDied, match=r"rollout worker 0 of 1 died during starting"
                       r".*device 'absent_device' is not available"):
        RaySampler(model=_tiny_model(), workers=1, worker_resources={"CPU": 0.5},
                   worker_device="absent_device")  # ray_test_samplers' device
    assert placed() <= before  # the failed start let go of its placement group


def test_missing_resources_fail_at_once_naming_them(ray_session):
    from astrai_plugin_ray.cluster import RayClusterError

    with pytest.raises(RayClusterError, match=r"NPU: 2 \(cluster has 0\).*ray start --resources"):
        RaySampler(model=_tiny_model(), workers=2, worker_resources={"NPU": 1})
