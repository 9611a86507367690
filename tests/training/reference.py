"""Independent references for run-level tests: a starting checkpoint written by hand,
text documents tokenized by hand, and the next-token cross-entropy written out.

Runs go through the public entry point (a YAML file -> load_config -> train), and are
compared through metrics.jsonl and the saved weights only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

from astrai_core.testing import ARITH_TOKENIZER, TINY_MODEL, read_metrics

TEXTS = ["12+34=46", "7+8=15", "100+1=101", "5+5=10", "66+3=69", "9+90=99", "1+2=3",
         "40+40=80"]


def write_texts(path: Path, texts: list[str] = TEXTS) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def text_documents(texts: list[str] = TEXTS) -> list[list[int]]:
    """Each text's tokens followed by EOS (the `text` format's documented rendering)."""
    from astrai_core.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ARITH_TOKENIZER)
    return [tokenizer(t, add_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]
            for t in texts]


def save_start_model(directory: Path, seed: int = 0) -> Path:
    """A tiny random native checkpoint (with the arithmetic tokenizer) to start runs from."""
    from astrai_core.checkpoints.native import save_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.model import CausalLM, ModelConfig

    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=len(load_tokenizer(ARITH_TOKENIZER)), **TINY_MODEL)
    save_pretrained(CausalLM(config), directory, tokenizer_dir=ARITH_TOKENIZER)
    return directory


def load_model(directory: Path) -> torch.nn.Module:
    from astrai_core.checkpoints.native import load_pretrained

    return load_pretrained(directory).float().eval()


def cross_entropy_sum(model: torch.nn.Module, documents: list[list[int]]) -> tuple[torch.Tensor, int]:
    """Sum over documents of -log p(token | the document's earlier tokens), written out
    with log_softmax and indexing, one unpadded forward per document; and the count."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    for ids in documents:
        logits = model(torch.tensor([ids]))["logits"][0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(1, len(ids)):
            total = total - logp[t - 1, ids[t]]
        count += len(ids) - 1
    return total, count


def mean_cross_entropy(model: torch.nn.Module, documents: list[list[int]]) -> torch.Tensor:
    total, count = cross_entropy_sum(model, documents)
    return total / count


def run(tmp_path: Path, config: dict[str, Any], name: str = "run.yaml") -> list[dict[str, Any]]:
    """Train ``config`` through load_config + train, as `astrai train` does; its metrics."""
    from astrai_core.config.loader import load_config
    from astrai_core.training.run import train

    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    train(load_config(path))
    return read_metrics(Path(config["output_dir"]))


def checkpoint_weights(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(Path(output_dir) / "checkpoints" / f"step_{step}" / "model.safetensors"))


def text_run_config(tmp_path: Path, data: Path, start: Path, out: str = "run",
                    **trainer: Any) -> dict[str, Any]:
    """A `seq` run over text documents, one per row, from the checkpoint ``start``."""
    return {
        "output_dir": str(tmp_path / out),
        "model": {"path": str(start)},
        "data": {"sources": [{"path": str(data), "format": "text"}], "seq_len": 32,
                 "pack": False, "batch_size": len(TEXTS), "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "seq"},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 1, "lr": 1e-2, "schedule": "constant", "eval_at_start": False,
                    "progress": False, **trainer},
    }
