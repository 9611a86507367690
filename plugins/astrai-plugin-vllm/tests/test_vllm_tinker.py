"""``astrai tinker --sampler vllm`` at the engine level: one vLLM engine on the base
serves each tenant's saved sampler adapter (vLLM's own LoRA support, an LM-head LoRA
included, on a tied and an untied head) and the bare base. Its greedy tokens are the
torch sampler's, its log-probs the torch engine's forward pass's, and tenants get their
own adapters' outputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")  # the vllm venv installs the core without its dependencies

BASE = "tiny"
PROMPTS = [[5, 9, 12, 40, 3], [7, 3, 88]]
TOLERANCE = 1e-3  # rollout.max_logprob_diff the plugin documents for float32 on CPU
GREEDY = dict(max_tokens=10, temperature=0.0)


def _train(engine, model_id: str, seed: int, unembed: bool = False) -> str:
    """A tenant trained a few steps towards its own sequence; its sampler weights' key."""
    from astrai_core.tinker.engine_types import AdamSpec, LoraSpec

    engine.create_model(model_id, BASE, LoraSpec(rank=4, seed=seed, train_unembed=unembed))
    datum = _datum([int(t) for t in np.random.default_rng(seed).integers(1, 120, size=12)])
    for _ in range(4):
        engine.forward_backward(model_id, [datum], "cross_entropy")
        engine.optim_step(model_id, AdamSpec(learning_rate=5e-2))
    return engine.save_weights(model_id, "sampler", for_sampler=True)


def _datum(tokens: list[int]):
    """A cross-entropy datum predicting each of ``tokens`` from those before it."""
    from astrai_core.tinker.engine_types import DatumIn

    return DatumIn(tokens[:-1], {"target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                                 "weights": np.ones(len(tokens) - 1, dtype=np.float32)})


def _forward(engine, model_id: str, prompt: list[int], completion: list[int]) -> list[float]:
    """The tenant's log-probs of ``completion`` after ``prompt``, from the torch engine's forward."""
    out = engine.forward(model_id, [_datum(prompt + completion)], "cross_entropy").outputs[0]["logprobs"]
    return out[len(prompt) - 1:].tolist()


def _sample(engine, key, prompt, n=1, **spec):
    from astrai_core.tinker.engine_types import SamplerTarget, SampleSpec

    return engine.sample(SamplerTarget(BASE, key), prompt, n, SampleSpec(**spec)).sequences


@pytest.fixture(scope="module", params=["untied", "tied"])
def served(request, helpers, tmp_path_factory):
    """A torch engine on a tiny dense model with the vllm backend (one vLLM start per
    head kind), two tenants trained on different data, and a third with a head LoRA."""
    from astrai_core.tinker.engine import build_engine
    from astrai_core.tinker.sample_backends import registry_backend

    model = helpers.build_tiny_model("dense", 0, tmp_path_factory.mktemp(request.param),
                                     tie=request.param == "tied")
    engine = build_engine({BASE: str(model.native_dir)}, tmp_path_factory.mktemp("state"),
                          max_lora_rank=8)
    engine.backend = registry_backend("vllm", list(engine.bases.values()), 2,
                                      options=dict(helpers.engine_options))
    keys = {"a": _train(engine, "a", 1), "b": _train(engine, "b", 2),
            "head": _train(engine, "head", 3, unembed=True)}
    sampler = engine.backend.samplers[BASE]
    served_adapters = []  # the adapter directory of each call the vLLM sampler gets

    def recording(prompts, params, adapter=None):
        served_adapters.append(None if adapter is None else adapter.parts[-4])
        return type(sampler).generate(sampler, prompts, params, adapter=adapter)

    sampler.generate = recording
    yield engine, keys, served_adapters
    engine.backend.close()


def _torch_side(engine):
    """A context in which the engine samples with the torch sampler."""
    import contextlib

    from astrai_core.tinker.sample_backends import TorchBackend

    @contextlib.contextmanager
    def swapped():
        backend, engine.backend = engine.backend, TorchBackend()
        try:
            yield
        finally:
            engine.backend = backend
    return swapped()


def test_each_tenants_greedy_tokens_are_the_torch_samplers(served):
    engine, keys, calls = served
    calls.clear()
    tenants = ["a", "b", "head"]
    got = {m: [_sample(engine, keys[m], p, **GREEDY)[0].tokens for p in PROMPTS]
           for m in tenants}
    got["base"] = [_sample(engine, None, p, **GREEDY)[0].tokens for p in PROMPTS]
    with _torch_side(engine):
        want = {m: [_sample(engine, keys[m], p, **GREEDY)[0].tokens for p in PROMPTS]
                for m in tenants}
        want["base"] = [_sample(engine, None, p, **GREEDY)[0].tokens for p in PROMPTS]
    assert got == want
    assert calls == [m for m in tenants for _ in PROMPTS] + [None] * 2  # all from vLLM
    # each adapter really changes the outputs, and differently: no tenant gets another's
    assert len({str(tokens) for tokens in got.values()}) == 4


@pytest.mark.parametrize("top_k", [-1, 5])
def test_sampled_logprobs_are_the_torch_engines_forward(served, top_k):
    """n samples at temperature 1: vLLM's own log-probs without a filter, the base module
    with the adapter in effect recomputing them with top-k (vLLM's are renormalised)."""
    engine, keys, calls = served
    calls.clear()
    for model_id in ("a", "b", "head"):
        sequences = _sample(engine, keys[model_id], PROMPTS[0], n=3, max_tokens=8, seed=7,
                            top_k=top_k)
        assert len(sequences) == 3 and len({tuple(s.tokens) for s in sequences}) > 1
        for sequence in sequences:
            forward = _forward(engine, model_id, PROMPTS[0], sequence.tokens)
            assert np.max(np.abs(np.subtract(sequence.logprobs, forward))) <= TOLERANCE
    assert calls == ["a", "b", "head"]


def test_weights_saved_again_under_the_same_name_are_served_new(served):
    """vLLM caches an adapter by id: a directory rewritten in place gets a new one."""
    from astrai_core.tinker.engine_types import AdamSpec

    engine, keys, calls = served
    key = _train(engine, "again", 4)
    before = _sample(engine, key, PROMPTS[0], **GREEDY)[0].tokens
    datum = _datum([int(t) for t in np.random.default_rng(9).integers(1, 120, size=12)])
    for _ in range(4):
        engine.forward_backward("again", [datum], "cross_entropy")
        engine.optim_step("again", AdamSpec(learning_rate=5e-2))
    assert engine.save_weights("again", "sampler", for_sampler=True) == key
    after = _sample(engine, key, PROMPTS[0], max_tokens=8, seed=5)[0]
    greedy = _sample(engine, key, PROMPTS[0], **GREEDY)[0].tokens
    with _torch_side(engine):
        assert greedy == _sample(engine, key, PROMPTS[0], **GREEDY)[0].tokens
    assert greedy != before
    forward = _forward(engine, "again", PROMPTS[0], after.tokens)
    assert np.max(np.abs(np.subtract(after.logprobs, forward))) <= TOLERANCE


def test_engine_options_are_checked_before_any_engine_starts():
    from astrai_core.errors import AstraiError
    from astrai_core.tinker.sample_backends import registry_backend

    for key in ("gpu_memory_utilisation", "max_adapters"):  # a typo; one astrai sets itself
        with pytest.raises(AstraiError, match=rf"^--sampler-option {key}: the vllm sampler "
                                              r"takes none of that name here; it takes: "
                                              r".*\bgpu_memory_utilization\b"):
            registry_backend("vllm", [], 2, options={key: 1})


def test_lora_engine_args_round_the_rank_up_to_one_vllm_sizes():
    from astrai_plugin_vllm.adapters import lora_engine_args

    assert lora_engine_args(0, 8) == {}
    assert lora_engine_args(3, 4) == {"enable_lora": True, "max_loras": 3, "max_lora_rank": 8}
    assert lora_engine_args(8, 128)["max_lora_rank"] == 128
    assert lora_engine_args(8, 129)["max_lora_rank"] == 256
    with pytest.raises(ValueError, match="up to 512"):
        lora_engine_args(1, 513)
