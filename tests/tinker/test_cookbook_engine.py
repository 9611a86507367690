"""tinker-cookbook's training loops, unmodified, against the server on the real torch engine
and a tiny float32 llama (its own character-level tokenizer, registered through the
cookbook's tokenizer hook): the supervised loop on the cookbook's example conversations and
the RL loop on the cookbook's arithmetic environment. No network."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
cookbook = pytest.importorskip("tinker_cookbook")

from astrai_core.testing.hf_models import write_hf_model_dir  # noqa: E402
from astrai_core.tinker.engine import build_engine  # noqa: E402
from tests.tinker.conftest import BASE, KEY, live_tinker  # noqa: E402


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with room for the arithmetic recipe's few-shot prompt (~70 tokens)."""
    return write_hf_model_dir(tmp_path_factory.mktemp("cookbook") / "llama", "llama",
                              max_position_embeddings=256)


@pytest.fixture
def real_server(long_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from tinker_cookbook import tokenizer_utils

    monkeypatch.setenv("TINKER_API_KEY", KEY)
    tokenizer = AutoTokenizer.from_pretrained(str(long_dir))
    tokenizer_utils.register_tokenizer(BASE, lambda: tokenizer)  # the cookbook's own hook: no hub
    engine = build_engine({BASE: str(long_dir)}, tmp_path / "state", cache_dir=str(tmp_path / "imports"))
    with live_tinker(engine) as live:
        yield live


def _metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_the_cookbook_supervised_loop_on_the_real_engine(real_server, tmp_path):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    conversations = Path(cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=BASE, renderer_name="role_colon",
                                            max_length=64, batch_size=2,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    log = tmp_path / "sl"
    config = train.Config(log_path=str(log), model_name=BASE, recipe_name="sl_test",
                          renderer_name="role_colon", lora_rank=4, learning_rate=1e-2,
                          dataset_builder=FromConversationFileBuilder(common_config=common,
                                                                      file_path=str(conversations)),
                          base_url=real_server.base_url, max_steps=3, save_every=2, eval_every=0)
    asyncio.run(train.main(config))

    nll = [s["train_mean_nll"] for s in _metrics(log) if "train_mean_nll" in s]
    assert len(nll) == 3 and all(math.isfinite(v) and v > 0 for v in nll)
    saved = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()]
    final = saved[-1]
    assert final["state_path"].startswith("tinker://") and final["state_path"].endswith("/weights/final")
    for key, files in (("state_path", {"adapter.safetensors", "optimizer.safetensors"}),
                       ("sampler_path", {"adapter.safetensors", "adapter"})):
        stored = real_server.engine.state_dir / final[key].removeprefix("tinker://")
        assert files <= {f.name for f in stored.iterdir()}, stored


def test_the_cookbook_rl_loop_on_the_arithmetic_env(real_server, tmp_path):
    # what recipes/math_rl/train.py builds for env=arithmetic (that module itself also
    # imports the math grader's optional dependencies, so the config is built here)
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
    from tinker_cookbook.rl import train

    log = tmp_path / "rl"
    dataset = ArithmeticDatasetBuilder(batch_size=2, group_size=2, model_name_for_tokenizer=BASE,
                                       renderer_name="role_colon", n_batches=100, include_fewshot=True)
    config = train.Config(learning_rate=1e-2, dataset_builder=dataset, model_name=BASE,
                          recipe_name="rl_test", renderer_name="role_colon", lora_rank=4, max_tokens=5,
                          log_path=str(log), base_url=real_server.base_url, eval_every=0, save_every=0,
                          loss_fn="importance_sampling", max_steps=2)
    asyncio.run(train.main(config))

    steps = [s for s in _metrics(log) if "progress/batch" in s]
    assert [s["progress/batch"] for s in steps] == [0, 1]
    for step in steps:  # each batch: 2 groups of 2 rollouts sampled, scored and trained on
        assert step["env/all/total_episodes"] == 4 and step["tokens/trained"] > 0
        # the recipe's reward: 1 if correct, minus 0.1 without the stop sequence
        assert -0.1 <= step["env/all/reward/total"] <= 1.0
        assert all(math.isfinite(v) for v in step.values() if isinstance(v, float)), step
        # the sampler's logprobs are the trainer's (one float32 model): no sample/train gap
        assert abs(step["optim/kl_sample_train_v1"]) < 1e-4


def test_the_math_rl_recipes_default_loss_is_refused_clearly(real_server, tmp_path):
    """``stable_reinforce`` (the math_rl recipe's default) is not served: the run stops at
    its first training step with the server's one-line reason, not a hang."""
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
    from tinker_cookbook.rl import train

    dataset = ArithmeticDatasetBuilder(batch_size=1, group_size=2, model_name_for_tokenizer=BASE,
                                       renderer_name="role_colon", n_batches=1)
    config = train.Config(learning_rate=1e-2, dataset_builder=dataset, model_name=BASE,
                          recipe_name="rl_test", renderer_name="role_colon", lora_rank=4, max_tokens=3,
                          log_path=str(tmp_path / "rl"), base_url=real_server.base_url, eval_every=0,
                          save_every=0, loss_fn="stable_reinforce", max_steps=1)
    with pytest.raises(Exception, match="unknown loss_fn 'stable_reinforce'; the built-in losses"):
        asyncio.run(train.main(config))
