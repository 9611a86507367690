"""The reward_model reward function: built from a config entry, it scores as the rm trained."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.rewards import RewardSet
from astrai_core.testing import build_strategy
from astrai_plugin_rm.checkpoint import load_reward_model


def test_scores_equal_the_strategy_on_the_same_pairs(tmp_path, rm_kit):
    """A plain (prompt, completion) scores what the rm strategy scores for that pair side."""
    native = rm_kit.native_rm(tmp_path / "rm", "llama")
    # the strategy's rendering of plain preference rows, with the same weights
    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl", count=8, plain=True)
    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path, data), tmp_path)
    model, _ = load_reward_model(native)
    batch = strategy.batch_source().next_step()[0]
    # the strategy's model is the tiny kit model; score its batch with the saved RM instead
    with torch.no_grad():
        expected = model(batch["chosen_input_ids"], batch["chosen_attention_mask"]).tolist()
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rewards = RewardSet.from_config([{"name": "reward_model", "path": str(native),
                                      "batch_size": 3}])
    totals, parts = rewards.score([r["prompt"] for r in rows], [r["chosen"] for r in rows],
                                  [{} for _ in rows])
    assert totals == pytest.approx(expected, abs=1e-5)
    assert len(set(round(t, 4) for t in totals)) > 4  # distinct scores: a real comparison


def test_templated_prompts_score_as_chat_pairs_trained(tmp_path, rm_kit):
    """Prompt data written as messages reaches a reward as the template-rendered prompt; the
    reward model scores exactly the tokens of the chat preference pair (auto -> templated)."""
    from astrai_core.data.render import render_prompt
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_plugin_rm.reward_model import RewardModelReward

    native = rm_kit.native_rm(tmp_path / "rm", "llama")
    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl", count=8)  # messages prompts
    strategy, _ = build_strategy(rm_kit.rm_config(tmp_path, data), tmp_path)
    batch = strategy.batch_source().next_step()[0]
    tokenizer = load_tokenizer(native)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    prompts = [render_prompt(tokenizer, {"prompt": None, "messages": r["messages"]})[0]
               for r in rows]
    reward = RewardModelReward(path=str(native), batch_size=5)
    scores = reward(prompts, [r["chosen"] for r in rows])
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        trained = batch["chosen_input_ids"][i][batch["chosen_attention_mask"][i].bool()]
        assert reward.token_ids(prompt, row["chosen"]) == trained.tolist()
    model, _ = load_reward_model(native)
    with torch.no_grad():
        expected = model(batch["chosen_input_ids"], batch["chosen_attention_mask"]).tolist()
    assert scores == pytest.approx(expected, abs=1e-5)
    # render: chat takes the prompt as a user message's content instead
    chat = RewardModelReward(path=str(native), render="chat")
    chat([rows[0]["messages"][0]["content"]], ["5"])
    expected_ids = tokenizer.apply_chat_template(
        [rows[0]["messages"][0], {"role": "assistant", "content": "5"}], tokenize=True,
        return_dict=True)["input_ids"]
    assert chat.token_ids(rows[0]["messages"][0]["content"], "5") == list(expected_ids)


def test_a_missing_checkpoint_is_a_config_error(tmp_path, rm_kit):
    from astrai_core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a reward-model checkpoint"):
        RewardSet.from_config([{"name": "reward_model", "path": str(tmp_path)}])
