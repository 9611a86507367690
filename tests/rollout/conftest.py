"""A fake sampler (deterministic, records its calls) and a tiny native model."""

from __future__ import annotations

import pytest
import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.sampling import Completion


class FakeSampler:
    """Completion j of prompt i: tokens [10 + i] * (j + 1), text "<answer of i>" for even j."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.calls: list[tuple[list[list[int]], list]] = []
        self.during_generate = None  # a hook the tests use to act while sampling

    def update_weights(self, state_dict=None) -> int:
        self.policy_version += 1
        return self.policy_version

    def generate(self, prompts, params, on_token=None):
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        self.calls.append(([list(p) for p in prompts], per_prompt))
        if self.during_generate is not None:
            self.during_generate()
        out = []
        for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
            for j in range(p.n):
                tokens = [10 + prompt[0]] * (j + 1)
                text = str(prompt[0] * 2) if j % 2 == 0 else "wrong"
                out.append(Completion(token_ids=tokens, logprobs=[-0.5 * (k + 1) for k in range(j + 1)],
                                      finish_reason="stop", text=text, prompt_index=i))
        return out


@pytest.fixture
def fake_sampler() -> FakeSampler:
    return FakeSampler()


def records(values):
    """Prompt records for prompt ids [v]; the answer column is 2v."""
    return [{"prompt_ids": [v], "prompt_text": f"q{v}", "columns": {"answer": str(2 * v)}} for v in values]


@pytest.fixture
def make_records():
    return records


@pytest.fixture(scope="session")
def native_model() -> CausalLM:
    torch.manual_seed(3)
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                         num_kv_heads=2, max_position_embeddings=128)
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model.eval()
