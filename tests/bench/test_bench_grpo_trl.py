"""bench/bench_grpo_trl.py compares like with like: astrai's run is given the very prompt
token ids TRL's GRPOTrainer generates from (a string prompt tokenized as raw text, no
special tokens added), so neither trains on more prompt tokens than the other."""

from __future__ import annotations

import argparse

import pytest

from astrai_core.data.tokenize import RenderOptions, tokenize_source
from astrai_core.testing import REPO_ROOT

BENCH = REPO_ROOT / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_grpo_trl

    return bench_grpo_trl


def test_astrai_trains_on_the_prompt_tokens_trl_generates_from(bench, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bench.TOKENIZER))
    args = argparse.Namespace(prompts=4, steps=2, group=2, lr=1e-5, device="cpu")
    config = bench.astrai_config(tmp_path, tmp_path / "native", args, {"max_new_tokens": 4})
    source = config["data"]["sources"][0]
    options = RenderOptions(chat_template=source.get("chat_template", True))
    rows = tokenize_source(source["path"], source["format"], tokenizer, tmp_path / "cache",
                           options=options)
    texts = bench.prompts(args.prompts * args.steps)
    assert len(rows) == len(texts)
    for index, text in enumerate(texts):
        # what TRL's GRPOTrainer feeds its model for a string prompt
        trl_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert rows.fields["prompt"].tokens_of(index).tolist() == trl_ids, text
