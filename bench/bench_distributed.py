"""SFT throughput on 1 process vs 2 processes (FSDP2 over gloo) with the same total
number of CPU threads, the same config and the same global batch.

The peer is astrai's own 1-process run using both threads (``trainer.threads: 2``);
the 2-process run gives each process one thread. Each run's number is the median of its
steps' ``throughput/tokens_per_s`` (metrics.jsonl) after two warm-up steps. Reported:
the 2-process / 1-process ratio at the same 2 threads (the peer), and the scaling
efficiency against one process on one thread, 2-process / (2 x 1-thread): 1.0 is
perfect scaling (the collectives and per-process overheads cost the rest).

    .venv/bin/python bench/bench_distributed.py [--steps 20] [--batch 16] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = {"hidden_size": 256, "intermediate_size": 704, "num_layers": 4, "num_heads": 4,
         "num_kv_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}


def config(tmp: Path, data: Path, name: str, args: argparse.Namespace, threads: int,
           steps: int | None = None) -> Path:
    run = {
        "output_dir": str(tmp / name),
        "model": {"tokenizer": str(REPO / "examples" / "arith" / "tokenizer"),
                  "config": MODEL},
        "data": {"sources": [{"path": str(data / "sft_train.jsonl"), "format": "chat"}],
                 "seq_len": args.seq, "pack": True, "batch_size": args.batch,
                 "cache_dir": str(tmp / "cache")},
        "strategy": {"name": "sft"},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": steps or args.steps, "lr": 1e-3, "eval_at_start": False,
                    "eval_every": 0, "save_every": 0, "progress": False, "threads": threads},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def tokens_per_s(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["throughput/tokens_per_s"] for r in records[2:])


def train(path: Path, nproc: int) -> None:
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // nproc)}
    done = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "--log-format",
                           "json", "train", str(path), *launch], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{path.stem} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        subprocess.run([sys.executable, str(REPO / "examples" / "arith" / "generate.py"),
                        "--out", str(tmp / "data"), "--n-train", "4000"], check=True,
                       capture_output=True)
        one = config(tmp, tmp / "data", "one", args, threads=2)
        single = config(tmp, tmp / "data", "single", args, threads=1)
        two = config(tmp, tmp / "data", "two", args, threads=1)
        # one step first: it fills the token cache, so neither timed run tokenizes
        train(config(tmp, tmp / "data", "warm", args, threads=2, steps=1), 1)
        results = {}
        for label, path, nproc in (("1 process x 2 threads", one, 1),
                                   ("1 process x 1 thread", single, 1),
                                   ("2 processes x 1 thread", two, 2)):
            train(path, nproc)
            results[label] = tokens_per_s(tmp / path.stem)
    for label, value in results.items():
        print(f"{label:>24}: {value:,.0f} tok/s")
    both_threads, one_thread, double = results.values()
    print(f"SFT hidden 256, 4 layers, global batch {args.batch} x {args.seq}: 2 processes vs "
          f"1 process with the same 2 threads: {double / both_threads:.2f}x; scaling "
          f"efficiency vs 1 thread (2-process / (2 x 1-thread)): "
          f"{double / (2 * one_thread):.2f}")


if __name__ == "__main__":
    main()
