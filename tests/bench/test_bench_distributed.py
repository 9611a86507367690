"""bench/bench_distributed.py does not rot: its default size is still the 3.0M model the
README reports, its large size a 20-40M one on as many tokens a step, and a bad option is one clear line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.testing import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_distributed.py"
ARITH_VOCAB = 55  # examples/arith/tokenizer


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_distributed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameters(model: dict) -> int:
    with torch.device("meta"):
        return CausalLM(ModelConfig(vocab_size=ARITH_VOCAB, **model)).num_parameters()


def per_layer(hidden: int, kv: int, inner: int) -> int:
    """q and o (hidden x hidden), k and v (hidden x kv width), gate, up and down."""
    return 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner


def test_the_sizes_are_the_models_and_batches_reported():
    bench = load_bench()
    small, large = bench.SIZES["small"], bench.SIZES["large"]
    assert small[1:] == (16, 256, 20)  # the default the README's row was measured with
    matmuls = 4 * per_layer(256, 128, 704)
    assert matmuls < parameters(small[0]) < matmuls + 50_000  # + embedding and norms
    assert round(parameters(small[0]) / 1e6, 1) == 3.0
    assert 20e6 < parameters(large[0]) < 40e6
    assert parameters(large[0]) > 8 * per_layer(512, 256, 1408)
    assert large[1] * large[2] == small[1] * small[2] and large[2] > small[2]


@pytest.mark.parametrize("args", [["--batch", "3"], ["--steps", "2"], ["--size", "huge"]])
def test_a_bad_option_is_one_line_and_exit_2(args):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "error:" in done.stderr and "Traceback" not in done.stderr
    assert args[0] in done.stderr
