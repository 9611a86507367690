"""SFT throughput on 1 process vs 2 processes (FSDP2 over gloo) with the same total
number of CPU threads, the same config and the same global batch.

The peer is astrai's own 1-process run using both threads (``trainer.threads: 2``);
the 2-process run gives each process one thread. Each run's number is the median of its
steps' ``throughput/tokens_per_s`` (metrics.jsonl) after two warm-up steps. Reported:
the 2-process / 1-process ratio at the same 2 threads (the peer), and the scaling
efficiency against one process on one thread, 2-process / (2 x 1-thread): 1.0 is
perfect scaling.

Where the rest goes: two independent 1-thread processes are also run at the same time
(each on half the global batch, no collectives). Their summed rate is what the two
cores give two processes at all, so efficiency = cores' ceiling x FSDP's share, with
ceiling = pair / (2 x 1-thread) and FSDP's share = 2-process / pair.

``--size small`` (the default) is a 3.0M model on 16 x 256 tokens a step; ``--size
large`` is a 23.6M model on 8 x 512: the same tokens a step, 8x the matmul work, so
each collective's fixed cost and each op's Python overhead weigh 8x less against it
(a collective's bytes grow with the parameters as the compute does).

    .venv/bin/python bench/bench_distributed.py [--size small|large] [--steps N]
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
SMALL = {"hidden_size": 256, "intermediate_size": 704, "num_layers": 4, "num_heads": 4,
         "num_kv_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}
# the model, global batch, sequence length and steps of each --size
SIZES = {
    "small": (SMALL, 16, 256, 20),
    "large": ({**SMALL, "hidden_size": 512, "intermediate_size": 1408, "num_layers": 8,
               "num_heads": 8, "num_kv_heads": 4}, 8, 512, 4),
}


def config(tmp: Path, name: str, args: argparse.Namespace, threads: int,
           steps: int | None = None, batch: int | None = None) -> Path:
    run = {
        "output_dir": str(tmp / name),
        "model": {"tokenizer": str(REPO / "examples" / "arith" / "tokenizer"),
                  "config": SIZES[args.size][0]},
        "data": {"sources": [{"path": str(tmp / "data" / "sft_train.jsonl"), "format": "chat"}],
                 "seq_len": args.seq, "pack": True, "batch_size": batch or args.batch,
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


def start(path: Path, nproc: int) -> subprocess.Popen:
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    threads = yaml.safe_load(path.read_text())["trainer"]["threads"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-m", "astrai_core.cli.main", "--log-format",
                             "json", "train", str(path), *launch], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(path: Path, proc: subprocess.Popen) -> None:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{path.stem} failed:\n{err[-3000:]}")


def train(path: Path, nproc: int) -> float:
    finish(path, start(path, nproc))
    return tokens_per_s(path.parent / path.stem)


def train_pair(tmp: Path, args: argparse.Namespace) -> float:
    """Two 1-process, 1-thread runs at once, each on half the global batch: their summed
    rate is the two cores' own ceiling for two processes, with no collectives."""
    paths = [config(tmp, f"pair{i}", args, threads=1, batch=args.batch // 2) for i in (0, 1)]
    procs = [start(path, 1) for path in paths]
    for path, proc in zip(paths, procs):
        finish(path, proc)
    return sum(tokens_per_s(tmp / path.stem) for path in paths)


def measure(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        subprocess.run([sys.executable, str(REPO / "examples" / "arith" / "generate.py"),
                        "--out", str(tmp / "data"), "--n-train", "4000"], check=True,
                       capture_output=True)
        # one step first: it fills the token cache, so no timed run tokenizes
        warm = config(tmp, "warm", args, threads=2, steps=1)
        finish(warm, start(warm, 1))
        return {"1 process x 2 threads": train(config(tmp, "one", args, threads=2), 1),
                "1 process x 1 thread": train(config(tmp, "single", args, threads=1), 1),
                "2 processes x 1 thread": train(config(tmp, "two", args, threads=1), 2),
                "2 lone processes at once": train_pair(tmp, args)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, help="steps a run (2 of them warm-up)")
    parser.add_argument("--batch", type=int, help="global batch (rows a step)")
    parser.add_argument("--seq", type=int, help="tokens a row")
    args = parser.parse_args(argv)
    model, batch, seq, steps = SIZES[args.size]
    args.batch, args.seq, args.steps = args.batch or batch, args.seq or seq, args.steps or steps
    if args.steps < 3 or args.batch < 2 or args.batch % 2:
        parser.error("--steps must be at least 3 and --batch an even number of at least 2")
    results = measure(args)
    for label, value in results.items():
        print(f"{label:>24}: {value:,.0f} tok/s")
    both_threads, one_thread, double, pair = results.values()
    print(f"SFT --size {args.size} (hidden {model['hidden_size']}, {model['num_layers']} layers), "
          f"global batch {args.batch} x {args.seq}: 2 processes vs 1 process with the same 2 "
          f"threads: {double / both_threads:.2f}x; scaling efficiency vs 1 thread "
          f"(2-process / (2 x 1-thread)): {double / (2 * one_thread):.2f} = the cores' "
          f"ceiling {pair / (2 * one_thread):.2f} x FSDP's share {double / pair:.2f}")


if __name__ == "__main__":
    main()
