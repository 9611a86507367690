"""Named evaluation sets: `data.eval_sets` are evaluated beside `data.eval` and logged as
`eval/<name>/...`; `eval/accuracy` stays the unnamed set's."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from astrai_core.config.schema import RunConfig
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.training.run import train


def test_named_sets_are_logged_under_their_names(tmp_path):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    few = tmp_path / "few.jsonl"
    few.write_text("".join(prompts.read_text().splitlines(keepends=True)[:3]))
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2}, max_steps=2,
                             rewards=[{"name": "exact_match"},
                                      {"name": "format_regex", "pattern": "[0-9]"}])
    config["data"]["eval"] = {"path": str(prompts), "format": "prompt"}
    config["data"]["eval_sets"] = [{"name": "same", "path": str(prompts), "format": "prompt"},
                                   {"name": "few", "path": str(few), "format": "prompt"}]
    train(RunConfig.model_validate(config))
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    unnamed = {k: v for k, v in last.items() if k.startswith("eval/")
               and not k.startswith(("eval/same/", "eval/few/"))}
    assert {"eval/accuracy", "eval/reward", "eval/reward/format_regex"} <= set(unnamed)
    # the same file under a name: the same numbers, under eval/same/
    assert {k.replace("eval/", "eval/same/", 1): v for k, v in unnamed.items()} == \
        {k: v for k, v in last.items() if k.startswith("eval/same/")}
    assert {"eval/few/accuracy", "eval/few/reward/format_regex"} <= set(last)


def test_eval_set_names_are_unique_and_plain(tmp_path):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=4)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2})
    config["data"]["eval_sets"] = [{"name": "a", "path": str(prompts), "format": "prompt"}] * 2
    with pytest.raises(ValidationError, match="the name 'a' is used twice"):
        RunConfig.model_validate(config)
    config["data"]["eval_sets"] = [{"name": "A/b", "path": str(prompts), "format": "prompt"}]
    with pytest.raises(ValidationError, match="eval_sets.0.name"):
        RunConfig.model_validate(config)
