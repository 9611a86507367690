"""The run plan checks the sizes a run asks for against the model: ``data.seq_len``
against its context (one line naming the field), and the activation memory of one
micro-batch against what the device has, before the model loads."""

from __future__ import annotations

import json

import pytest

from astrai_core.config.model_fit import activation_bytes, model_dims
from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import write_hf_model_dir


def chat_config(tmp_path, **data):
    rows = tmp_path / "chat.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1"},
                                             {"role": "assistant", "content": "2"}]}) + "\n")
    return tiny_run_config(tmp_path, rows, {"name": "sft"}, data_format="chat", data=data)


def test_seq_len_past_the_context_is_one_plan_error_naming_the_field(tmp_path):
    config = chat_config(tmp_path, seq_len=512)  # TINY_MODEL: 64 positions
    with pytest.raises(ConfigError, match=r"data\.seq_len: 512 tokens exceed the model's context "
                       r"of 64 positions \(model\.config\.max_position_embeddings\); use at most 64"):
        plan_run(RunConfig.model_validate(config))
    config["data"]["seq_len"] = 64
    plan_run(RunConfig.model_validate(config))


def test_a_hugging_face_models_context_is_read_from_its_config(tmp_path):
    config = chat_config(tmp_path, seq_len=65)
    hf = write_hf_model_dir(tmp_path / "hf", "gpt_neox")  # 64 positions
    config["model"] = {"path": str(hf)}
    with pytest.raises(ConfigError, match=r"data\.seq_len: 65 tokens exceed the model's context "
                       r"of 64 positions \(max_position_embeddings of .*hf/config\.json\)"):
        plan_run(RunConfig.model_validate(config))


def test_the_default_seq_len_and_prompt_data_are_not_refused(tmp_path):
    plan_run(RunConfig.model_validate(chat_config(tmp_path)))  # 512 by default: a warning
    prompts = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                              {"name": "grpo"}, data={"seq_len": 4096})  # prompts: not cut to it
    plan_run(RunConfig.model_validate(prompts))


def test_activation_estimate_is_the_product_of_the_sizes(tmp_path):
    config = RunConfig.model_validate(chat_config(tmp_path, seq_len=64, batch_size=8))
    dims = {"hidden": 32, "layers": 2, "vocab": 100}
    need, sizes = activation_bytes(config, dims, 64)
    assert need == 8 * 64 * 32 * 34 * 2 * 2 + 2 * 8 * 64 * 100 * 4  # float32: 68 bytes a unit
    assert sizes == "8 rows x 64 tokens x hidden 32 x 2 layers + logits over 100 tokens"
    assert model_dims(config, None) == {"hidden": 32, "layers": 2, "vocab": 0}


def test_a_run_that_cannot_fit_the_device_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from astrai_core.devices.cpu import CpuBackend
    from astrai_core.training import run

    monkeypatch.setattr(CpuBackend, "available_memory", lambda self: 100_000)
    monkeypatch.setattr(run, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    config = RunConfig.model_validate(chat_config(tmp_path, seq_len=64, batch_size=8))
    with pytest.raises(ConfigError, match=r"data\.batch_size: activations of about 2\.1 MiB "
                       r"\(8 rows x 64 tokens x hidden 32 x 2 layers\) cannot fit the 97\.7 KiB "
                       r"of cpu memory; lower data\.batch_size"):
        run.prepare_run(config)
    # a quarter of the estimate is enough: only a run that cannot fit by far is refused
    monkeypatch.setattr(CpuBackend, "available_memory", lambda self: 2_228_224 // 4)
    with pytest.raises(BaseException, match="the model was built"):
        run.prepare_run(config)
