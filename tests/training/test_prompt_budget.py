"""Rollout prompts and the model's context: data.max_prompt_len defaults to what the
context leaves after the generation, a run whose prompts cannot fit is a plan-time error
naming the fields, and a single prompt too long to fit is skipped, counted (the
data/prompts_skipped metric) and reported in one warning line."""

from __future__ import annotations

import json

import pytest

from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.testing import (ARITH_TOKENIZER, TINY_MODEL, read_metrics, run_astrai,
                                 tiny_run_config, write_arith_prompts)
from tests.training.conftest import write_config

CONTEXT = 128
LONG = "1" * 199 + "+2="  # 205 tokens once rendered through the chat template


def _config(tmp_path, prompts=None, **sections):
    prompts = prompts or write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             max_steps=2, **sections.pop("trainer", {}))
    config["model"]["config"] = dict(TINY_MODEL, max_position_embeddings=CONTEXT)
    for section, values in sections.items():
        config[section].update(values)
    return config


def test_max_prompt_len_defaults_to_what_the_context_leaves(tmp_path):
    plan = plan_run(RunConfig.model_validate(_config(tmp_path, sampler={"max_new_tokens": 28})))
    assert plan.config.data.max_prompt_len == CONTEXT - 28
    given = _config(tmp_path, data={"max_prompt_len": 40}, sampler={"max_new_tokens": 28})
    assert plan_run(RunConfig.model_validate(given)).config.data.max_prompt_len == 40


def test_a_generation_that_fills_the_context_is_one_error_line(tmp_path):
    path = write_config(tmp_path, _config(tmp_path, sampler={"max_new_tokens": CONTEXT}))
    done = run_astrai("train", str(path))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "sampler.max_new_tokens" in errors[0], errors
    assert f"context of {CONTEXT} tokens (model.config.max_position_embeddings)" in errors[0]
    assert not (tmp_path / "run").exists()


def test_a_max_prompt_len_that_does_not_fit_beside_the_generation(tmp_path):
    config = _config(tmp_path, data={"max_prompt_len": 100}, sampler={"max_new_tokens": 30})
    with pytest.raises(ConfigError) as raised:
        plan_run(RunConfig.model_validate(config))
    message = str(raised.value)
    assert message.startswith("data.max_prompt_len: 100 prompt tokens + "
                              "sampler.max_new_tokens 30 = 130 exceed"), message
    assert "at most 98 prompt tokens fit" in message


def test_a_prompt_longer_than_the_context_is_skipped_counted_and_reported_once(tmp_path):
    from astrai_core.data.render import render_prompt
    from astrai_core.data.tokenizer import load_tokenizer

    row = {"prompt": None, "messages": [{"role": "user", "content": LONG}]}
    assert len(render_prompt(load_tokenizer(ARITH_TOKENIZER), row)[1]) == 205
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    with prompts.open("a") as f:
        f.write(json.dumps({"messages": row["messages"], "answer": "3"}) + "\n")
    path = write_config(tmp_path, _config(tmp_path, prompts))
    done = run_astrai("--log-format", "console", "train", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert f"skipped 1 prompt(s) longer than data.max_prompt_len={CONTEXT - 3}" in warnings[0]
    records = read_metrics(tmp_path / "run")
    assert [r["data/prompts_skipped"] for r in records] == [1, 1]


def _long_context(tmp_path, context: int, **model_fields):
    config = _config(tmp_path, data={"max_prompt_len": 32768}, sampler={"max_new_tokens": 1024})
    config["model"]["config"].update(max_position_embeddings=context, **model_fields)
    return config


def test_32k_prompts_are_accepted_where_the_context_holds_them(tmp_path):
    plan = plan_run(RunConfig.model_validate(_long_context(tmp_path, 40960)))
    assert plan.config.data.max_prompt_len == 32768


def test_32k_prompts_beyond_the_context_are_one_error_line(tmp_path):
    path = write_config(tmp_path, _long_context(tmp_path, 32768))
    done = run_astrai("train", str(path))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith(f"error: {path}:"), errors  # the file and the line
    assert errors[0].endswith("data.max_prompt_len: 32768 prompt tokens + sampler.max_new_tokens "
                              "1024 = 33792 exceed the model's context of 32768 tokens "
                              "(model.config.max_position_embeddings); lower one of them (at "
                              "most 31744 prompt tokens fit)"), errors
    assert not (tmp_path / "run").exists()


def test_a_yarn_scaled_context_holds_longer_prompts(tmp_path):
    """A config stating its original length and a YaRN factor (Qwen2.5's long-context
    setting) holds factor x that length: the default max_prompt_len is what that leaves."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    config = _long_context(tmp_path, 32768, rope_scaling=yarn)
    del config["data"]["max_prompt_len"]
    plan = plan_run(RunConfig.model_validate(config))
    assert plan.config.data.max_prompt_len == 4 * 32768 - 1024
    # a model directory's config.json, in transformers' newer spelling
    directory = tmp_path / "qwen"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 32768, "rope_parameters": {**yarn, "rope_theta": 1e6}}))
    from astrai_core.config.prompt_budget import model_context

    config["model"] = {"path": str(directory)}
    context, where = model_context(RunConfig.model_validate(config))
    assert context == 131072 and "YaRN factor 4" in where, where
