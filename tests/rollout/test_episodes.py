"""Multi-turn episodes: exact tokens and masks, log-prob parity, faults, limits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from astrai_core.environments.episode_config import EpisodeConfig
from astrai_core.environments.tools import Tools
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout import policy_forward
from astrai_core.rollout.episodes import EpisodeRunner
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.sampling import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from tests.rollout import episode_kit as kit

CALCULATOR = "astrai_core.environments.calculator:calculator"
KIT = "tests.rollout.episode_kit"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(kit.CALC_TOKENIZER))


def _records(tokenizer, questions):
    rows = []
    for question, answer in questions:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
        rows.append({"prompt_ids": tokenizer(text, add_special_tokens=False)["input_ids"],
                     "prompt_text": text, "columns": {"answer": answer}})
    return rows


def _runner(tokenizer, script, environment=None, **episode):
    from astrai_core.rollout.records import as_prompt_record

    environment = environment or Tools(tools=[CALCULATOR])
    sampler = kit.ScriptedSampler(tokenizer, script)
    rewards = RewardSet.from_config([{"name": "exact_match"}])
    runner = EpisodeRunner(environment, sampler, tokenizer, rewards, EpisodeConfig(**episode),
                           pad_token_id=tokenizer.pad_token_id)
    return runner, as_prompt_record


def _play(tokenizer, script, questions=(("123*45=", "5535"),), group_size=1, params=None,
          environment=None, **episode):
    runner, as_record = _runner(tokenizer, script, environment, **episode)
    records = [as_record(r) for r in _records(tokenizer, questions)]
    params = params or SamplingParams(max_new_tokens=40, stop_token_ids=(tokenizer.eos_token_id,))
    return runner.run(records, params, group_size=group_size), runner


def _response(batch, row=0):
    return batch.response_ids[row][batch.context_mask[row]].tolist()


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("closes_turn", [False, True], ids=["stops at </tool_call>", "ends its turn"])
def test_a_scripted_episode_holds_exactly_the_conversation_the_template_renders(tokenizer, closes_turn):
    end = "<|end|>" if closes_turn else ""
    call = kit.calc_call("123*45")
    batch, runner = _play(tokenizer, [call + end, "5535<|end|>"], stop_at_tool_call=not closes_turn)
    # The reference: the chat template's rendering of the whole conversation.
    messages = [{"role": "user", "content": "123*45="}, {"role": "assistant", "content": call},
                {"role": "tool", "content": "5535"}, {"role": "assistant", "content": "5535"}]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    prompt = batch.prompts[0]
    assert full.startswith(prompt)
    assert _response(batch) == _ids(tokenizer, full[len(prompt):])
    model_turns = [_ids(tokenizer, call + end), _ids(tokenizer, "5535<|end|>")]
    env_span = _ids(tokenizer, ("" if closes_turn else "<|end|>") + "<|tool|>5535<|end|><|assistant|>")
    expected_mask = [True] * len(model_turns[0]) + [False] * len(env_span) + [True] * len(model_turns[1])
    assert batch.response_mask[0][batch.context_mask[0]].tolist() == expected_mask
    assert not batch.response_mask[0][~batch.context_mask[0]].any()
    # Behaviour log-probs: the sampler's, in order, on the model's tokens; 0 elsewhere.
    scripted = [-1 - 0.01 * k for k in range(len(model_turns[0]))] + \
               [-2 - 0.01 * k for k in range(len(model_turns[1]))]
    got = batch.old_logprobs[0]
    assert torch.allclose(got[batch.response_mask[0]], torch.tensor(scripted))
    assert (got[~batch.response_mask[0]] == 0).all()
    assert batch.finish_reasons == ["stop"] and batch.rewards.tolist() == [1.0]
    assert batch.episode_stats == [{"turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0,
                                    "env_seconds": batch.episode_stats[0]["env_seconds"]}]
    assert batch.completions == [call + "5535"]  # the model's own text only
    # The second turn was sampled on the whole context: prompt, call, tool result.
    second_context = runner.sampler.calls[1][0][0]
    assert second_context == batch.prompt_ids[0][batch.prompt_mask[0]].tolist() + \
        _response(batch)[:len(model_turns[0]) + len(env_span)]


def test_finished_episodes_leave_the_batch(tokenizer):
    """One prompt's episodes answer at once, the other's call the tool first."""
    script = {"1+2=": ["3<|end|>"], "12*34=": [kit.calc_call("12*34"), "408<|end|>"]}
    runner, as_record = _runner(tokenizer, script)
    records = [as_record(r) for r in _records(tokenizer, [("1+2=", "3"), ("12*34=", "408")])]
    batch = runner.run(records, SamplingParams(max_new_tokens=40, stop_token_ids=(6,)), group_size=2)
    assert [len(prompts) for prompts, _ in runner.sampler.calls] == [4, 2]  # turn 2: two left
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.rewards.tolist() == [1.0] * 4
    assert [s["turns"] for s in batch.episode_stats] == [1.0, 1.0, 2.0, 2.0]
    metrics = rollout_metrics(batch)
    assert metrics["rollout/turns_mean"] == 1.5 and metrics["rollout/tool_calls_mean"] == 0.5
    assert metrics["rollout/tool_error_rate"] == 0.0


def _tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, max_position_embeddings=128)
    return CausalLM(config).eval()


def _plain_logprobs(model, batch, row):
    """The reference: one unpadded forward over the row's prompt and whole response."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row]].tolist()
    response = _response(batch, row)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response]))["logits"][0].double()
    logp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    picked = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
    model_tokens = batch.response_mask[row][batch.context_mask[row]]
    return picked[model_tokens]


def test_trainer_logprobs_of_a_multi_turn_episode_equal_a_plain_forward(tokenizer):
    questions = [("123*45=", "5535"), ("1+2+3=", "6")]
    batch, _ = _play(tokenizer, [kit.calc_call("123*45"), "5535<|end|>"], questions)
    model = _tiny_model(tokenizer)
    with torch.no_grad():
        trainer = policy_forward(model, batch)["logprobs"]
    for row in range(2):
        expected = _plain_logprobs(model, batch, row)
        assert torch.allclose(trainer[row][batch.response_mask[row]].double(), expected, atol=1e-5)
    # The environment's tokens matter: hiding them from attention changes the answer's log-probs.
    hidden = policy_forward(model, type(batch)(**{**batch.__dict__, "context_mask": None}))["logprobs"]
    assert not torch.allclose(hidden[0][batch.response_mask[0]].double(), _plain_logprobs(model, batch, 0),
                              atol=1e-3)


def test_the_torch_samplers_logprobs_line_up_with_the_trainers_across_turns(tokenizer):
    """A real sampler, turns of one token (every token stops a turn), an environment that
    always answers: the behaviour log-probs equal the trainer's at every model token."""
    model = _tiny_model(tokenizer, seed=1)
    sampler = TorchSampler(model, tokenizer)
    runner = EpisodeRunner(kit.EchoTurns(rounds=5), sampler, tokenizer, RewardSet([]),
                           EpisodeConfig(max_turns=3, max_tokens=100), pad_token_id=0)
    from astrai_core.rollout.records import as_prompt_record

    records = [as_prompt_record(r) for r in _records(tokenizer, [("1+2=", "3"), ("123*45=", "5535")])]
    params = SamplingParams(max_new_tokens=1, seed=0, stop_token_ids=tuple(range(len(tokenizer))))
    batch = runner.run(records, params, group_size=2)
    assert batch.finish_reasons == ["max_turns"] * 4
    assert batch.response_mask.sum(1).tolist() == [3] * 4
    assert (batch.context_mask.sum(1) > 3 + 2 * len(_ids(tokenizer, "<|user|>turn 0<|end|>"))).all()
    with torch.no_grad():
        trainer = policy_forward(model, batch)["logprobs"]
    mask = batch.response_mask
    assert torch.allclose(trainer[mask], batch.old_logprobs[mask], atol=1e-5)
    assert (batch.old_logprobs[~mask] == 0).all()


# ---------------------------------------------------------------- faults
def _tool_messages(tokenizer, batch):
    """The tool results the model saw, in order."""
    text = tokenizer.decode(_response(batch), skip_special_tokens=False)
    return [part.split("<|end|>")[0] for part in text.split("<|tool|>")[1:]]


def test_failing_tools_give_the_model_error_messages_and_the_episode_goes_on(tokenizer):
    tools = Tools(tools=[CALCULATOR, f"{KIT}:boom", f"{KIT}:slow", f"{KIT}:add"], timeout=0.2)
    script = [kit.call("boom", '{"x": 7}'), kit.call("slow", "{}"), kit.call("add", '{"c": 1}'),
              kit.call("add", '[1, 2]'), '<tool_call>{"name": calculator}</tool_call>',
              kit.call("nope", "{}"), kit.calc_call("2**99"), kit.call("add", '{"a": 2, "b": 3}'),
              "5535<|end|>"]
    kit.RELEASE.clear()
    try:
        batch, _ = _play(tokenizer, script, environment=tools, max_turns=10, max_tokens=2000,
                         params=SamplingParams(max_new_tokens=100, stop_token_ids=(6,)))
    finally:
        kit.RELEASE.set()
    messages = _tool_messages(tokenizer, batch)
    assert len(messages) == 8
    assert "error: boom: RuntimeError: boom 7" in messages[0]
    assert "error: slow: CallTimeout: timed out after 0.2 s" in messages[1]
    assert messages[2] == "error: bad arguments for add: missing a required argument: 'a'"
    assert "error: bad arguments for add" in messages[3]  # a list: the parser gives {}
    assert "error: the tool call could not be parsed" in messages[4]
    assert "error: unknown tool 'nope'" in messages[5]
    assert messages[6].startswith("error: calculator: ValueError: unsupported")
    assert messages[7] == "5"
    assert batch.finish_reasons == ["stop"] and batch.rewards.tolist() == [1.0]
    stats = batch.episode_stats[0]
    assert (stats["turns"], stats["tool_calls"], stats["tool_errors"]) == (9.0, 8.0, 7.0)
    assert rollout_metrics(batch)["rollout/tool_error_rate"] == 7 / 8


def test_an_environment_that_raises_or_hangs_gives_error_messages(tokenizer):
    batch, _ = _play(tokenizer, [kit.calc_call("1+1"), "2<|end|>"], questions=[("1+1=", "2")],
                     environment=kit.RaisingEnv())
    assert _tool_messages(tokenizer, batch) == ["error: KeyError: 'no such thing'"]
    assert batch.finish_reasons == ["stop"] and batch.episode_stats[0]["tool_errors"] == 1.0

    class Hangs(kit.RaisingEnv):
        def step(self, state, turn):
            if turn.index == 0:
                kit.RELEASE.wait()
            return super().step(state, turn) if turn.index else None

    kit.RELEASE.clear()
    try:
        batch, _ = _play(tokenizer, [kit.calc_call("1+1"), "2<|end|>"], questions=[("1+1=", "2")],
                         environment=Hangs(), step_timeout=0.2)
    finally:
        kit.RELEASE.set()
    assert _tool_messages(tokenizer, batch) == ["error: no result within 0.2 s"]
    assert batch.rewards.tolist() == [1.0]


def test_max_turns_ends_an_endless_tool_loop(tokenizer):
    batch, runner = _play(tokenizer, [kit.calc_call("1+1")], max_turns=3)
    assert batch.finish_reasons == ["max_turns"]
    assert len(runner.sampler.calls) == 3
    assert batch.episode_stats[0]["turns"] == 3.0 and batch.episode_stats[0]["tool_calls"] == 3.0
    assert len(_tool_messages(tokenizer, batch)) == 2  # the last call's result is never shown
    assert batch.response_mask[0][batch.context_mask[0]].tolist()[-1]  # ends with the model's call
    assert rollout_metrics(batch)["rollout/max_turns_fraction"] == 1.0


def test_the_token_budget_ends_an_episode(tokenizer):
    call = kit.calc_call("1+1")
    batch, _ = _play(tokenizer, [call], max_tokens=len(_ids(tokenizer, call)) + 3)
    assert batch.finish_reasons == ["length"]
    assert int(batch.context_mask.sum()) == len(_ids(tokenizer, call))  # no room for the result
    batch, _ = _play(tokenizer, ["1234567"], params=SamplingParams(max_new_tokens=4))
    assert batch.finish_reasons == ["length"] and int(batch.response_mask.sum()) == 4


def test_an_environment_without_step_fails_when_its_spec_loads():
    from astrai_core import EnvironmentSpec
    from astrai_core.errors import PluginError

    spec = EnvironmentSpec(name="half", target="tests.rollout.episode_kit:boom", summary="not one")
    with pytest.raises(PluginError, match="environment 'half'.*lacks reset, step"):
        spec.load()
    assert EnvironmentSpec(name="ok", target=f"{KIT}:EchoTurns", summary="one").load() is kit.EchoTurns
