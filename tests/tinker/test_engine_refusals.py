"""Each request the engine cannot serve raises EngineRequestError with a message naming
the problem, and the engine keeps serving afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from astrai_core.tinker.engine_types import (AdamSpec, DatumIn, EngineRequestError, LoraSpec,
                                             SamplerTarget, SampleSpec)
from tests.tinker.conftest import BASE, sft_datums


@pytest.fixture
def engine(make_engine):
    engine = make_engine(max_adapters=2, max_datums=3, max_tokens_per_datum=12)
    engine.create_model("m", BASE, LoraSpec(rank=4, seed=0))
    return engine


def _datum(tokens, **inputs):
    length = len(tokens)
    base = {"target_tokens": np.ones(length, dtype=np.int64),
            "weights": np.ones(length, dtype=np.float32)}
    return DatumIn(list(tokens), {**base, **inputs})


@pytest.mark.parametrize(("call", "message", "status"), [
    (lambda e: e.create_model("x", "no/such", LoraSpec(rank=4)), "unknown base model 'no/such'", 404),
    (lambda e: e.create_model("x", BASE, LoraSpec(rank=129)), "LoRA rank 129", 400),
    (lambda e: e.create_model("x", BASE, LoraSpec(rank=4, train_attn=False, train_mlp=False,
                                                      train_unembed=False)),
     "trains nothing", 400),
    (lambda e: e.create_model("m", BASE, LoraSpec(rank=4)), "exists already", 409),
    (lambda e: e.forward("nope", [_datum([1, 2])], "cross_entropy"), "unknown model_id 'nope'", 404),
    (lambda e: e.forward("m", [_datum([1, 64])], "cross_entropy"), "datum 0: model_input: token id 64", 400),
    (lambda e: e.forward("m", [_datum([1, 2], target_tokens=np.array([1, -1]))], "cross_entropy"),
     "datum 0: loss_fn_inputs['target_tokens']: token id -1", 400),
    (lambda e: e.forward("m", [_datum([1]), _datum([1, 2], weights=np.ones(3, np.float32))],
                         "cross_entropy"), "datum 1: loss_fn_inputs['weights'] has shape [3]", 400),
    (lambda e: e.forward("m", [_datum([1, 2])], "ppo"), "datum 0: loss_fn_inputs has no 'logprobs'", 400),
    (lambda e: e.forward("m", [_datum([1, 2])], "kl"), "unknown loss_fn 'kl'", 400),
    (lambda e: e.forward("m", [_datum([1, 2])], "cross_entropy", {"beta": 1.0}),
     "cross_entropy takes no 'beta'", 400),
    (lambda e: e.forward("m", [_datum([1])] * 4, "cross_entropy"), "4 datums", 413),
    (lambda e: e.forward("m", [_datum(range(1, 14))], "cross_entropy"), "datum 0: 13 tokens", 400),
    (lambda e: e.forward("m", [], "cross_entropy"), "no datums", 400),
    (lambda e: e.optim_step("m", AdamSpec(beta1=1.5)), "betas", 400),
    (lambda e: e.sample(SamplerTarget(BASE), [1, 99], 1, SampleSpec()), "prompt: token id 99", 400),
    (lambda e: e.sample(SamplerTarget(BASE), [1], 1, SampleSpec(max_tokens=100)), "max_tokens 100", 400),
    (lambda e: e.sample(SamplerTarget(BASE, "m/sampler_weights/none"), [1], 1, SampleSpec()),
     "not found", 404),
    (lambda e: e.sample(SamplerTarget(BASE, "../../etc"), [1], 1, SampleSpec()),
     "expected <model_id>/<weights|sampler_weights>/<name>", 404),
    (lambda e: e.save_weights("m", "../up", for_sampler=False), "checkpoint name '../up'", 400),
    (lambda e: e.load_weights("m", "m/weights/none", with_optimizer=True), "not found", 404),
])
def test_refusals_name_the_problem(engine, call, message, status):
    with pytest.raises(EngineRequestError, match=None) as caught:
        call(engine)
    assert message in str(caught.value)
    assert caught.value.status == status
    datums, _, _ = sft_datums(lengths=(5,))
    assert np.isfinite(engine.forward_backward("m", datums, "cross_entropy").metrics["loss:sum"])


def test_adapter_limit_and_unload(engine):
    engine.create_model("second", BASE, LoraSpec(rank=2))
    with pytest.raises(EngineRequestError, match="at most 2 adapters") as caught:
        engine.create_model("third", BASE, LoraSpec(rank=2))
    assert caught.value.status == 429
    engine.unload_model("second")
    engine.create_model("third", BASE, LoraSpec(rank=2))
    with pytest.raises(EngineRequestError, match="unknown model_id 'second'"):
        engine.model_base("second")
    assert engine.model_base("third").name == BASE


def test_sampler_weights_hold_no_optimizer(engine):
    key = engine.save_weights("m", "s", for_sampler=True)
    with pytest.raises(EngineRequestError, match="without optimizer state"):
        engine.load_weights("m", key, with_optimizer=True)
    engine.load_weights("m", key, with_optimizer=False)


def test_build_engine_offers_its_models_and_names_a_bad_path(hf_dir, tmp_path):
    from astrai_core.errors import AstraiError
    from astrai_core.tinker.engine import build_engine

    engine = build_engine({"a": str(hf_dir), "b": str(hf_dir)}, tmp_path / "state",
                          max_lora_rank=16, cache_dir=str(tmp_path / "imports"))
    facts = {f.name: f for f in engine.base_models()}
    assert set(facts) == {"a", "b"}
    assert facts["a"].vocab_size == 64 and facts["a"].max_lora_rank == 16
    assert facts["a"].tokenizer_path == str(hf_dir)
    with pytest.raises(AstraiError, match=r"--model x=/no/such/dir: .*does not exist"):
        build_engine({"x": "/no/such/dir"}, tmp_path / "state")
