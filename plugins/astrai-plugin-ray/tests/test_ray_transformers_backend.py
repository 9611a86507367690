"""The ray sampler with a transformers-backend policy: the workers hold the same
transformers model, pushes carry the family's own names and leave every worker with the
trainer's weights bit for bit (LoRA: the adapter only), and a GRPO run logs what the
local torch sampler's run logs."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import RunConfig, SamplingParams
from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import tiny_causal_lm, write_hf_model_dir
from astrai_plugin_ray.sampler import RaySampler

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3], [2, 2, 7], [9, 1]]


def _policy(lora: bool):
    from astrai_core.model.lora import inject_lora, peft_lora_config
    from astrai_core.model_backends.transformers_lm import TransformersCausalLM

    model = TransformersCausalLM(tiny_causal_lm("olmo2")).eval()
    if lora:
        inject_lora(model, peft_lora_config(r=4, alpha=8, dropout=0.0,
                                            target_modules=["q_proj", "v_proj"],
                                            use_rslora=False, use_dora=False))
    return model


@pytest.mark.parametrize("lora", [False, True])
def test_pushes_give_every_worker_the_trainers_weights_exactly(ray_session, lora):
    from astrai_core.sampling.torch_sampler import TorchSampler

    model = _policy(lora)
    sampler = RaySampler(model=model, workers=2, worker_resources={"CPU": 0.5})
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.add_(torch.randn_like(parameter) * 0.05)
        sampler.update_weights()
        pushed = sampler.metrics()["rollout/weight_push_mb"] * 2**20
        trained = sum(p.numel() * p.element_size() for p in model.parameters()
                      if p.requires_grad)
        assert pushed == trained  # LoRA: the adapter only
        expected = model.state_dict()
        for weights in sampler.worker_weights():
            assert weights.keys() == expected.keys()
            assert all(torch.equal(weights[k], expected[k]) for k in expected)
        params = SamplingParams(max_new_tokens=5, seed=3, n=2)
        assert ([c.token_ids for c in sampler.generate(PROMPTS, params)]
                == [c.token_ids for c in TorchSampler(model).generate(PROMPTS, params)])
        # a push names the family's tensors as transformers does (no wrapper prefix)
        name = "model.layers.0.mlp.down_proj.weight"
        value = torch.randn_like(model.hf.get_submodule("model.layers.0.mlp.down_proj").weight)
        sampler.update_weights({name: value})
        for weights in sampler.worker_weights():
            assert torch.equal(weights[f"hf.{name}"], value)
    finally:
        sampler.close()


def _grpo(tmp_path, hf, sampler=None):
    from astrai_core.training.run import train

    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4},
                             sampler=sampler, max_steps=2, data={"batch_size": 4})
    config["model"] = {"path": str(hf)}
    train(RunConfig.model_validate(config))
    return read_metrics(tmp_path / "run")


def test_grpo_with_ray_workers_logs_the_local_samplers_metrics(ray_session, tmp_path,
                                                              assert_logs_match):
    hf = write_hf_model_dir(tmp_path / "hf", "olmo2")
    local = _grpo(tmp_path / "local", hf)
    remote = _grpo(tmp_path / "ray", hf, {"name": "ray", "workers": 2,
                                          "worker_sampler": {"name": "torch"}})
    assert [r["step"] for r in remote] == [1, 2]
    assert all(r["rollout/weight_push_mb"] > 0 for r in remote)
    assert any(r["grad_norm"] > 0 for r in local)  # the policy moved: pushes mattered
    assert_logs_match(remote, local)


def test_a_worker_sampler_other_than_torch_is_one_plan_error(ray_session, tmp_path):
    """The workers' own sampler must generate with the transformers model they hold."""
    from astrai_core.api import ConfigError
    from astrai_core.config.plan import plan_run

    hf = write_hf_model_dir(tmp_path / "hf", "olmo2")
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl", count=8),
                             {"name": "grpo", "group_size": 4},
                             sampler={"name": "ray", "worker_sampler": {"name": "slow_torch"}})
    config["model"] = {"path": str(hf)}
    with pytest.raises(ConfigError) as caught:
        plan_run(RunConfig.model_validate(config))
    message = str(caught.value)
    assert message.startswith("sampler.worker_sampler.name: worker sampler 'slow_torch' cannot "
                              "take the weights of model_type 'olmo2' on the transformers "
                              "backend"), message
    assert "\n" not in message
    config["sampler"]["worker_sampler"] = {"name": "torch"}
    assert plan_run(RunConfig.model_validate(config)).sampler.name == "ray"
    config["sampler"] = {**config["sampler"], "name": "slow_torch"}  # any other sampler
    del config["sampler"]["worker_sampler"]
    with pytest.raises(ConfigError, match="^sampler.name: sampler 'slow_torch' cannot take the "
                       "weights of model_type 'olmo2' on the transformers backend yet; use the "
                       "torch, vllm or ray sampler$"):
        plan_run(RunConfig.model_validate(config))


MODEL_CODE = '''
from transformers import Olmo2Config, Olmo2ForCausalLM


class ShippedConfig(Olmo2Config):
    model_type = "shipped_lm"


class ShippedLM(Olmo2ForCausalLM):
    config_class = ShippedConfig
'''


def test_model_code_the_directory_ships_reaches_the_workers(ray_session, tmp_path):
    """A model built from the directory's own code (trust_remote_code) lives in a module
    only the trainer's process imported; the workers get it with the model."""
    import json

    from astrai_core.checkpoints.hf_model import load_transformers_model
    from astrai_core.sampling.torch_sampler import TorchSampler

    hf = write_hf_model_dir(tmp_path / "shipped_code_model", "olmo2")
    (hf / "modeling_shipped.py").write_text(MODEL_CODE)
    config = json.loads((hf / "config.json").read_text())
    config.update(model_type="shipped_lm",
                  auto_map={"AutoConfig": "modeling_shipped.ShippedConfig",
                            "AutoModelForCausalLM": "modeling_shipped.ShippedLM"})
    (hf / "config.json").write_text(json.dumps(config))
    model = load_transformers_model(hf, trust_remote_code=True)
    assert type(model.hf).__module__.startswith("transformers_modules.")
    sampler = RaySampler(model=model, workers=1, worker_resources={"CPU": 0.5})
    try:
        params = SamplingParams(max_new_tokens=4, seed=5, n=2)
        assert ([c.token_ids for c in sampler.generate(PROMPTS, params)]
                == [c.token_ids for c in TorchSampler(model).generate(PROMPTS, params)])
    finally:
        sampler.close()
