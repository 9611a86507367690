"""rollout.max_logprob_diff on real runs: a weight push that silently does not land stops
the run with one error line naming the sampler and the mismatch; a push that lands runs
through. The sampler here is the torch sampler over its own copy of the policy, so that
its weights reach it only through ``update_weights`` (as an engine's do)."""

from __future__ import annotations

import re

import pytest
import structlog
import yaml

from astrai_core.cli.main import main
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from tests.training.conftest import install_plugin

PLUGIN = '''
import copy
import dataclasses

from astrai_core import hookimpl, SamplerSpec
from astrai_core.sampling.torch_sampler import TorchSampler

@hookimpl
def astrai_samplers():
    return [SamplerSpec(name="torch_copy", target="push_test_plugin:TorchCopy",
                        summary="the torch sampler over its own copy of the policy")]

class TorchCopy(TorchSampler):
    # its own copy: each publish hands it the policy's weights
    capabilities = dataclasses.replace(TorchSampler.capabilities, shares_policy=False)

    def __init__(self, model, tokenizer=None, **engine):
        super().__init__(copy.deepcopy(model), tokenizer, **engine)
'''
LIMIT = 1e-4  # the documented threshold for the torch sampler
STEPS = 3


@pytest.fixture(autouse=True)
def _copying_sampler(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, "push_test_plugin", {"push_test_plugin": PLUGIN})
    # main() would point structlog at capsys's stream, which closes with this test
    monkeypatch.setattr("astrai_core.cli.main.configure_logging", lambda *a, **k: None)
    yield
    structlog.reset_defaults()


def _train(tmp_path, **strategy):
    config = tiny_run_config(
        tmp_path, write_arith_prompts(tmp_path / "prompts.jsonl", count=8),
        {"name": "grpo", "group_size": 4, **strategy},
        sampler={"name": "torch_copy", "max_new_tokens": 4, "stop_token_ids": []},
        max_steps=STEPS, save_every=1)
    config["data"]["batch_size"] = 2
    config["rollout"] = {"max_logprob_diff": LIMIT}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", str(path)])
    return exit_info.value.code


# {}: grpo measures the mismatch in its training forward; epochs 2: in a no-grad forward
# over the rollout when it is drawn (so the second rollout, drawn at step 3, is the stale one)
CASES = [({}, 2), ({"epochs": 2}, 3)]


@pytest.mark.parametrize(("strategy", "stale_step"), CASES)
def test_a_push_that_does_not_land_stops_the_run(tmp_path, capsys, monkeypatch, strategy,
                                                 stale_step):
    def lost_push(self, state_dict=None):  # the version moves on, the weights do not
        self.policy_version += 1
        return self.policy_version
    monkeypatch.setattr(TorchSampler, "update_weights", lost_push)
    capsys.readouterr()
    assert _train(tmp_path, **strategy) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    match = re.fullmatch(
        rf"error: sampler 'torch_copy' disagrees with the trainer at step {stale_step}: its "
        r"log-probs differ by up to (\S+) \(rollout.max_logprob_diff: 0.0001\); .*", lines[0])
    assert match, lines[0]
    assert float(match.group(1)) > 100 * LIMIT  # a whole training step apart, not noise
    # the steps before were checked and saved; the stale one was not
    logged = read_metrics(tmp_path / "run")
    assert [m["step"] for m in logged] == list(range(1, stale_step))
    assert all(m["rollout/logprob_diff_max"] <= LIMIT for m in logged)
    assert not (tmp_path / "run" / "checkpoints" / f"step_{stale_step}").exists()
    assert (tmp_path / "run" / "checkpoints" / f"step_{stale_step - 1}").exists()


@pytest.mark.parametrize(("strategy", "stale_step"), CASES)
def test_a_push_that_lands_runs_through(tmp_path, strategy, stale_step):
    assert _train(tmp_path, **strategy) == 0
    logged = read_metrics(tmp_path / "run")
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))
    assert all(m["rollout/logprob_diff_max"] <= LIMIT for m in logged)


class _TwoRanks:
    """A 2-rank context whose other rank measured ``other``."""

    enabled = True

    def __init__(self, other: float) -> None:
        self.other = other

    def all_gather_object(self, obj):
        return [obj, self.other]


def test_the_check_takes_the_worst_rank_and_fails_on_nan():
    from astrai_core.training.push_check import SamplerMismatch, check_logprob_mismatch

    fine = {"rollout/logprob_diff_max": 1e-6}
    check_logprob_mismatch(fine, None, "torch", 1, _TwoRanks(5.0))  # no limit: no check
    check_logprob_mismatch(fine, 1e-4, "torch", 1, _TwoRanks(2e-6))
    check_logprob_mismatch({}, 1e-4, "torch", 1, _TwoRanks(0.0))  # nothing measured
    # every rank raises when one rank's share of the tokens disagrees (no rank waits alone)
    with pytest.raises(SamplerMismatch, match=r"sampler 'vllm' .* at step 7: .* up to 0.5 "):
        check_logprob_mismatch(fine, 1e-4, "vllm", 7, _TwoRanks(0.5))
    with pytest.raises(SamplerMismatch, match="up to nan"):
        check_logprob_mismatch({"rollout/logprob_diff_max": float("nan")}, 1e-4, "torch", 1,
                               _TwoRanks(0.0))
    with pytest.raises(SamplerMismatch, match="up to nan"):
        check_logprob_mismatch(fine, 1e-4, "torch", 1, _TwoRanks(float("nan")))
