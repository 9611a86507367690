"""Test doubles for multi-turn episodes: a scripted sampler, tools that fail, an outside
environment plugin (``ASTRAI_PLUGINS=tests.rollout.episode_kit``) and the calc tokenizer."""

from __future__ import annotations

import threading

from astrai_core import EnvironmentSpec, hookimpl
from astrai_core.api import EnvMessage, EnvStep
from astrai_core.sampling import Completion
from astrai_core.testing import REPO_ROOT
from tests.rollout.conftest import FakeSampler

CALC_TOKENIZER = REPO_ROOT / "examples" / "calc" / "tokenizer"
CALL = '<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def call(name: str, arguments: str) -> str:
    """A Hermes tool call as the model writes it."""
    return CALL.format(name=name, arguments=arguments)


def calc_call(expression: str) -> str:
    return call("calculator", '{"expression": "%s"}' % expression)


class ScriptedSampler(FakeSampler):
    """Turn k of every episode is ``script[k]`` (a string; ``<|end|>`` spelled out where the
    model ends its turn; the last entry repeats). The turn is read from the context: the
    number of assistant generation prompts in it, minus one. ``script`` may also be a dict
    {text in the prompt: script}. Log-probs are ``-(turn + 1) - 0.01 * i``."""

    def __init__(self, tokenizer, script: list[str]) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.script = script
        self.assistant = tokenizer.convert_tokens_to_ids("<|assistant|>")

    def generate(self, prompts, params, on_token=None):
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        self.calls.append(([list(p) for p in prompts], per_prompt))
        out = []
        for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
            turn = list(prompt).count(self.assistant) - 1
            script = self._script(prompt)
            ids = self.tokenizer(script[min(turn, len(script) - 1)],
                                 add_special_tokens=False)["input_ids"]
            reason = "stop" if len(ids) <= p.max_new_tokens else "length"
            ids = ids[:p.max_new_tokens]
            out.append(Completion(token_ids=ids, logprobs=[-(turn + 1) - 0.01 * k for k in range(len(ids))],
                                  finish_reason=reason, prompt_index=i))
        return out

    def _script(self, prompt) -> list[str]:
        if isinstance(self.script, list):
            return self.script
        text = self.tokenizer.decode(list(prompt))
        return next(script for key, script in self.script.items() if key in text)


# ---------------------------------------------------------------- tools that misbehave
RELEASE = threading.Event()  # the slow tool waits for it (the test sets it when done)


def boom(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"boom {x}")


def slow() -> str:
    """Never returns before RELEASE is set."""
    RELEASE.wait()
    return "late"


def add(a: int, b: int = 0) -> int:
    """Adds two integers."""
    return a + b


# ---------------------------------------------------------------- an outside environment
class EchoTurns:
    """Answers every turn with a user message ``turn <k>`` for ``rounds`` turns, then ends
    the episode with reward 1 when the last turn wrote a digit (plus the reward functions)."""

    def __init__(self, rounds: int = 2) -> None:
        self.rounds = rounds

    def reset(self, row):
        return {"answer": row["columns"].get("answer")}

    def step(self, state, turn):
        if turn.index + 1 >= self.rounds:
            return EnvStep(done=True, reward=float(any(c.isdigit() for c in turn.text)))
        return EnvStep(messages=(EnvMessage(role="user", content=f"turn {turn.index}"),))


class RaisingEnv:
    """Its step raises on the first turn and ends the episode on the next."""

    def reset(self, row):
        return None

    def step(self, state, turn):
        if turn.index == 0:
            raise KeyError("no such thing")
        return EnvStep(done=True)


class OwnEpisodes:
    """Plays its episodes itself (``episode_runner``) and scores them (``rewards_episodes``):
    each episode is the prompt followed by ``[7, 8]`` (the model's), the environment's
    ``[9]`` and the model's ``[7]``, with reward 0.25 per episode index in its group."""

    rewards_episodes = True

    def reset(self, row):
        raise AssertionError("an environment with its own runner is never reset")

    step = reset

    def episode_runner(self, *, sampler, tokenizer, rewards, config, pad_token_id=0):
        return OwnRunner(pad_token_id)


class OwnRunner:
    def __init__(self, pad_token_id):
        self.pad_token_id, self.calls = pad_token_id, []

    def run(self, records, params, group_size=1, policy_version=0, seed_offset=0, first_prompt=0):
        import torch

        from astrai_core.api import RolloutBatch, episode_tensors

        self.calls.append((len(records), group_size))
        rows = [r for r in records for _ in range(group_size)]
        count = len(rows)
        tokens = episode_tensors([r.prompt_ids for r in rows], [[7, 8, 9, 7]] * count,
                                 [[True, True, False, True]] * count,
                                 [[-1.0, -1.0, 0.0, -1.0]] * count, self.pad_token_id)
        return RolloutBatch(
            **tokens, rewards=torch.tensor([0.25 * (i % group_size) for i in range(count)]),
            reward_components={}, group_ids=torch.tensor([i // group_size for i in range(count)]),
            policy_version=policy_version, prompts=[""] * count, completions=[""] * count,
            columns=[{} for _ in range(count)], finish_reasons=["stop"] * count)


@hookimpl
def astrai_environments():
    return [EnvironmentSpec(name="echo_turns", target="tests.rollout.episode_kit:EchoTurns",
                            summary="test: answers each turn, ends after `rounds`"),
            EnvironmentSpec(name="own_episodes", target="tests.rollout.episode_kit:OwnEpisodes",
                            summary="test: plays and scores its episodes itself")]
