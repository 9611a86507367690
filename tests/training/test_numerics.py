"""`astrai train` fixes the CPU thread count and turns on deterministic algorithms on a
CPU device, as trainer.threads / trainer.deterministic say (docs/user-guide.md has the
measurements behind the defaults)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.config.schema import RunConfig
from astrai_core.training.run import prepare_run, train
from tests.training.conftest import tiny_config


@pytest.fixture
def restore_numerics():
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_and_deterministic_algorithms_are_set(tmp_path, restore_numerics, threads):
    torch.set_num_threads(3 - threads)  # start from the other count
    torch.use_deterministic_algorithms(False)
    prepare_run(RunConfig.model_validate(tiny_config(tmp_path, threads=threads)))
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()


def test_null_threads_and_deterministic_off_leave_torch_alone(tmp_path, restore_numerics):
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    config = tiny_config(tmp_path, threads=None, deterministic=False)
    prepare_run(RunConfig.model_validate(config))
    assert torch.get_num_threads() == 2
    assert not torch.are_deterministic_algorithms_enabled()


def test_train_gives_the_caller_its_numerics_back(tmp_path, restore_numerics):
    # A benchmark's peer or a notebook cell run after train() in the same process must not
    # inherit its pinned thread count or deterministic mode (the latter fills every
    # torch.empty with NaN: it made TRL's GRPO step 1.5x slower in bench_grpo_trl.py).
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    train(RunConfig.model_validate(tiny_config(tmp_path, threads=1)))
    assert torch.get_num_threads() == 2
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_default_is_one_thread():
    config = RunConfig.model_validate(tiny_config_defaults())
    assert (config.trainer.threads, config.trainer.deterministic) == (1, True)


def tiny_config_defaults() -> dict:
    return {"output_dir": "x", "model": {"path": "m"}, "strategy": {"name": "sft"},
            "data": {"sources": [{"path": "d.jsonl", "format": "chat"}]},
            "trainer": {"max_steps": 1}}
