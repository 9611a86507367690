"""parallel.context_parallel: SFT whose rows' tokens are split over a context group equals
the one-process run (packed rows, whose documents straddle the shard boundary, and padded
rows), on 2 processes (one group of 2) and on 4 (2 data-parallel groups of 2), with the
native decoder and with transformers models; the plan refuses what it cannot split, in one
line."""

from __future__ import annotations

import json

import pytest

from astrai_core.checkpoints.hf_model import BACKEND_FILE
from astrai_core.testing import read_metrics
from astrai_core.testing.hf_models import write_hf_model_dir
from tests.distributed.conftest import assert_close_metrics, assert_close_weights, ok, train, weights
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 and 4 processes under torchrun
STEPS = 3
LOSSES = ("loss", "lm_loss", "grad_norm", "tokens")


def _config(tmp_path, name, pack=True, **parallel):
    config = tiny_config(tmp_path, max_steps=STEPS, warmup_steps=1, save_every=STEPS,
                         progress=False, eps=1e-6)
    config["data"]["pack"] = pack
    rows = (tmp_path / "data" / "sft_train.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "held_out.jsonl").write_text("".join(rows[-15:]))
    config["data"]["eval"] = {"path": str(tmp_path / "held_out.jsonl"), "format": "chat"}
    config["trainer"].update(eval_every=STEPS, eval_at_start=True)
    config["output_dir"] = str(tmp_path / name)
    config["parallel"] = parallel
    return config


def _split(done) -> None:
    """The run succeeded, with its rows split over context groups of 2."""
    ok(done)
    events = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
              if line.startswith("{")]
    assert [e["context_parallel"] for e in events if e.get("event") == "distributed"] == [2]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_context_parallel_two_processes_equal_one(tmp_path, pack):
    ok(train(_config(tmp_path, "one", pack), tmp_path, "one"))
    _split(train(_config(tmp_path, "cp", pack, context_parallel=2), tmp_path, "cp", 2))
    one, cp = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "cp")
    steps = [[r for r in run if "loss" in r] for run in (one, cp)]
    assert len(steps[1]) == STEPS
    assert_close_metrics(*steps, LOSSES)
    evals = [[r["eval/loss"] for r in run if "eval/loss" in r] for run in (one, cp)]
    assert len(evals[0]) == 2 and evals[1] == pytest.approx(evals[0], rel=1e-5)
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "cp", STEPS))


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_a_transformers_model_on_two_processes_equals_one(tmp_path, model_type):
    """model.backend: transformers, packed rows: astrai's attention inside the family's
    layers (Gemma 3's sliding-window layers among them) splits the rows as the native
    decoder does."""
    hf = write_hf_model_dir(tmp_path / "hf", model_type)

    def config(name, **parallel):
        return {**_config(tmp_path, name, **parallel),
                "model": {"path": str(hf), "backend": "transformers"}}

    ok(train(config("one"), tmp_path, "one"))
    _split(train(config("cp", context_parallel=2), tmp_path, "cp", 2))
    one, cp = ([r for r in read_metrics(tmp_path / run) if "loss" in r] for run in ("one", "cp"))
    assert len(cp) == STEPS
    assert (tmp_path / "cp" / "checkpoints" / f"step_{STEPS}" / BACKEND_FILE).is_file()
    assert_close_metrics(one, cp, LOSSES)
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "cp", STEPS))


def test_two_data_groups_of_two_equal_one_process(tmp_path):
    ok(train(_config(tmp_path, "one"), tmp_path, "one"))
    _split(train(_config(tmp_path, "dp2cp2", context_parallel=2), tmp_path, "dp2cp2", 4))
    one, mesh = ([r for r in read_metrics(tmp_path / run) if "loss" in r]
                 for run in ("one", "dp2cp2"))
    assert_close_metrics(one, mesh, LOSSES)
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "dp2cp2", STEPS))


@pytest.mark.parametrize("change, message", [
    ({"parallel": {"context_parallel": 4}}, "parallel.context_parallel: 4 ranks per context "
     "group do not divide the 2 processes of this run"),
    ({"parallel": {"context_parallel": 2}, "model.config.num_heads": 3},
     "parallel.context_parallel: the model's 3 query heads do not divide over 2 ranks"),
])
def test_the_plan_refuses_what_it_cannot_split(tmp_path, change, message):
    config = _config(tmp_path, "refused")
    for key, value in change.items():
        if key == "model.config.num_heads":
            config["model"]["config"].update(num_heads=value, num_kv_heads=value,
                                              hidden_size=24)
        else:
            config[key] = value
    done = train(config, tmp_path, "refused", 2)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and message in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_a_transformers_family_outside_astrais_attention_is_refused(tmp_path):
    config = _config(tmp_path, "refused", context_parallel=2)
    config["model"] = {"path": str(write_hf_model_dir(tmp_path / "hf", "phi3")),
                       "backend": "transformers"}
    done = train(config, tmp_path, "refused", 2)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused.yaml:" in errors[0], done.stderr[-3000:]
    assert errors[0].endswith(
        "parallel.context_parallel: model_type 'phi3' runs on the transformers backend, "
        "where context parallelism supports llama, mistral, qwen2, qwen3, gemma3_text; "
        "remove context_parallel"), errors[0]
    assert "Traceback" not in done.stderr


def test_a_strategy_that_cannot_split_its_rows_is_refused(tmp_path):
    from astrai_core.config.context_parallel import check_context_parallel
    from astrai_core.config.schema import RunConfig
    from astrai_core.config.strategy_needs import StrategyNeeds
    from astrai_core.errors import FieldError

    config = RunConfig.model_validate(_config(tmp_path, "grpo", context_parallel=2))
    check_context_parallel(config, StrategyNeeds(("chat",), context_parallel=True), None, 2)
    check_context_parallel(config, StrategyNeeds(("prompt",), rollouts=True), None, 1)
    with pytest.raises(FieldError, match="strategy 'sft' does not split its rows' tokens"):
        check_context_parallel(config, StrategyNeeds(("prompt",), rollouts=True), None, 2)
