"""The chunked LM head under FSDP2 (2 CPU processes, gloo): policy_forward on a sharded
native model computes log-probs and entropy chunk by chunk inside the model's forward
(where FSDP has gathered the head), equal within 1e-6 to the full-logits path of the same
model unsharded, and so are the gradients of every parameter; for an untied head, a tied
embedding, and a LoRA policy (and its disabled-adapter reference). See
chunked_head_worker.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.conftest import run_torchrun

pytestmark = pytest.mark.slow  # 2 processes under torch.distributed.run
WORKER = Path(__file__).with_name("chunked_head_worker.py")
VOCAB, CHUNK, TOKENS = 41, 4, 18  # the worker's
CHUNKS = -(-TOKENS // CHUNK)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("chunked_head")
    run_torchrun(WORKER, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", ["untied", "tied", "lora"])
def test_sharded_chunked_head_equals_the_unsharded_full_logits(ranks, case):
    for rank in ranks:
        result = rank[case]
        assert result["logprob_diff"] <= 1e-6 and result["entropy_diff"] <= 1e-6, result
        assert result["grad_diffs"] and max(result["grad_diffs"].values()) <= 1e-6, result
        names = result["grad_diffs"]
        if case == "lora":  # only the adapter has gradients
            assert all("lora_" in name for name in names)
        else:  # the head's gradient came through the chunks (tied: the embedding's)
            assert ("embed.weight" if case == "tied" else "lm_head.weight") in names
            assert case != "tied" or "lm_head.weight" not in names


@pytest.mark.parametrize("case", ["untied", "tied", "lora"])
def test_the_sharded_forward_took_the_chunked_path(ranks, case):
    """One chunk computation per 4 tokens in the forward, each recomputed once in the
    backward; autograd kept no chunk's logits (checkpointed), the full path all of them."""
    for rank in ranks:
        result = rank[case]
        assert result["forward_chunks"] == CHUNKS
        assert result["all_chunks"] == 2 * CHUNKS
        assert result["chunked_saved"] <= CHUNK * VOCAB
        assert result["full_saved"] >= TOKENS * VOCAB  # the hook sees logits when kept


def test_lora_reference_is_the_sharded_policy_without_its_adapter(ranks):
    for rank in ranks:
        assert rank["lora"]["reference_diff"] <= 1e-6
        assert rank["lora"]["adapter_effect"] > 1e-3  # the adapter matters: a real check
