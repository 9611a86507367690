"""A multi-turn tool environment: the model calls a verifiers tool (an MCP server), the
result comes back as context, the model answers; only the model's tokens are trained on."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import Completion, SamplingParams, load_tokenizer
from astrai_core.testing import REPO_ROOT
from astrai_plugin_verifiers.environment import VerifiersEnvironment

CALC_TOKENIZER = REPO_ROOT / "examples" / "calc" / "tokenizer"
CALL = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
SCRIPT = [CALL, "5<|end|>"]  # turn 0 calls the tool, turn 1 answers


class ScriptedSampler:
    """Turn k (read from the context: its assistant generation prompts, minus one) writes
    ``SCRIPT[k]``, with log-probs ``-(k + 1) - 0.01 * i``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.assistant = tokenizer.convert_tokens_to_ids("<|assistant|>")

    def generate(self, prompts, params, on_token=None):
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        out = []
        for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
            turn = list(prompt).count(self.assistant) - 1
            ids = self.tokenizer(SCRIPT[min(turn, len(SCRIPT) - 1)],
                                 add_special_tokens=False)["input_ids"][:p.max_new_tokens]
            out.append(Completion(token_ids=ids, logprobs=[-(turn + 1) - 0.01 * k for k in range(len(ids))],
                                  finish_reason="stop", prompt_index=i))
        return out


class Episode:
    max_turns, max_tokens, stop_at_tool_call = 3, None, True


class NoRewardFunctions:
    def score(self, prompts, completions, columns, completion_ids=None):
        return [0.0] * len(completions), {}


@pytest.mark.slow
def test_a_tool_episode_trains_on_the_model_turns_and_sees_the_tool_result():
    tokenizer = load_tokenizer(CALC_TOKENIZER)
    environment = VerifiersEnvironment(env="verifiers_tool_env:sums")
    runner = environment.episode_runner(sampler=ScriptedSampler(tokenizer), tokenizer=tokenizer,
                                        rewards=NoRewardFunctions(), config=Episode())
    params = SamplingParams(max_new_tokens=80, stop_token_ids=(tokenizer.eos_token_id,))
    batch = runner.run([None, None], params, group_size=1)
    # the rubric: 2+3 answered 5 is right, 4+3 answered 5 is wrong
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert [s["turns"] for s in batch.episode_stats] == [2.0, 2.0]
    assert [s["tool_calls"] for s in batch.episode_stats] == [1.0, 1.0]
    turns = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in SCRIPT]
    for i in range(2):
        valid = batch.context_mask[i].bool()
        mask = batch.response_mask[i][valid]
        ids = batch.response_ids[i][valid]
        assert ids[mask].tolist() == turns[0] + turns[1]  # the sampled tokens, both turns
        between = tokenizer.decode(ids[~mask].tolist())
        assert between == "<|end|><|tool|>5<|end|><|assistant|>"  # the tool's result: context
        logprobs = batch.old_logprobs[i][valid]
        want = [-1 - 0.01 * k for k in range(len(turns[0]))] + [-2 - 0.01 * k for k in range(len(turns[1]))]
        assert torch.allclose(logprobs[mask], torch.tensor(want))
        assert not logprobs[~mask].any()
