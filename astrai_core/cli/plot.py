"""`astrai plot RUN_DIR`: PNG curves of every metric in RUN_DIR/metrics.jsonl."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run's output_dir (holding metrics.jsonl)")
    parser.add_argument("--out", default=None, help="where to write PNGs (default RUN_DIR/plots)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from astrai_core.training.plot import plot_metrics

    written = plot_metrics(Path(args.run_dir), Path(args.out) if args.out else None)
    for path in written:
        print(path)
    return 0
