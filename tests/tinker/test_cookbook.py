"""tinker-cookbook's supervised loop (what ``recipes/sl_basic.py`` runs), unmodified, against
the server, on local conversations (the cookbook's example file) and a tiny tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("tinker")
cookbook = pytest.importorskip("tinker_cookbook")

from tests.tinker.fake_engine import BASE  # noqa: E402


def test_the_cookbook_supervised_loop_trains_and_saves(server, fake, tokenizer_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from tinker_cookbook import tokenizer_utils
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer_utils.register_tokenizer(BASE, lambda: tokenizer)  # the cookbook's own hook: no hub
    conversations = Path(cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=BASE, renderer_name="role_colon",
                                            max_length=128, batch_size=4,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    config = train.Config(log_path=str(tmp_path / "log"), model_name=BASE, recipe_name="sl_test",
                          renderer_name="role_colon", lora_rank=4, learning_rate=1e-2,
                          dataset_builder=FromConversationFileBuilder(common_config=common,
                                                                      file_path=str(conversations)),
                          base_url=server.base_url, max_steps=3, save_every=2, eval_every=0)
    asyncio.run(train.main(config))

    steps = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "train_mean_nll" in s] == [0, 1, 2]
    assert [call for call, _ in fake.log] == ["forward_backward", "optim_step"] * 3
    saved = [json.loads(line) for line in (tmp_path / "log" / "checkpoints.jsonl").read_text().splitlines()]
    final = saved[-1]
    assert final["state_path"].startswith("tinker://") and final["state_path"].endswith("/weights/final")
    assert (fake.state_dir / (final["sampler_path"].removeprefix("tinker://") + ".json")).is_file()
