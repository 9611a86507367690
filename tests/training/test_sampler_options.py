"""Training rollouts stop at the tokenizer's EOS unless the `sampler:` section says otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from astrai_core.testing import ARITH_EOS, build_strategy, tiny_run_config, write_arith_prompts
from astrai_core.training.run import rollout_sampling

DEFAULT = object()  # the section leaves stop_token_ids out


def _context(tmp_path, stop_token_ids, sampler_section: bool = True):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2})
    if not sampler_section:
        del config["sampler"]
        # room for a prompt beside the default 64 new tokens (else a plan-time error)
        config["model"]["config"]["max_position_embeddings"] = 128
    elif stop_token_ids is DEFAULT:
        del config["sampler"]["stop_token_ids"]
    else:
        config["sampler"]["stop_token_ids"] = stop_token_ids
    return build_strategy(config, tmp_path)


@pytest.mark.parametrize("stop_token_ids,expected", [
    (DEFAULT, (ARITH_EOS,)),      # like evaluation: stop at <|end|>
    ([], ()),                     # explicitly none: always max_new_tokens
    ([7, 9], (7, 9)),             # explicit ids replace the EOS
], ids=["unset", "empty", "explicit"])
def test_stop_token_ids_default_to_the_eos(tmp_path, stop_token_ids, expected):
    _, run = _context(tmp_path, stop_token_ids)
    assert run.tokenizer.eos_token_id == ARITH_EOS
    sampling, engine = run.sampling, run.plan.sampling_fields()[1]
    assert sampling.stop_token_ids == expected
    assert "stop_token_ids" not in engine
    assert sampling.max_new_tokens == 3 and sampling.seed == 0  # the rest of the section
    assert run.rollouts.sampling_params.stop_token_ids == expected  # the rollouts use them


def test_without_a_sampler_section_rollouts_stop_at_the_eos(tmp_path):
    _, run = _context(tmp_path, DEFAULT, sampler_section=False)
    assert run.sampling.stop_token_ids == (ARITH_EOS,)


def test_a_tokenizer_without_eos_means_no_default_stop(tmp_path):
    _, run = _context(tmp_path, DEFAULT)
    no_eos = SimpleNamespace(eos_token_id=None)
    assert rollout_sampling(run.plan, no_eos).stop_token_ids == ()
