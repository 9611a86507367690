"""Curves of a run's metrics.jsonl, one PNG per metric group, drawn with matplotlib."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from astrai_core.errors import DataError


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from a metrics.jsonl file."""
    if not path.is_file():
        raise DataError(f"{path} does not exist: is this a run directory?")
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}:{line_number}: not a metrics record ({exc})") from None
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series[name].append((step, float(value)))
    if not series:
        raise DataError(f"{path} has no metrics yet")
    return dict(series)


TRAIN_GROUP = "train"  # metrics without a "/" prefix (loss, grad_norm, lr, ...)
COLUMNS = 3
EVAL_PREFIX = "eval/"


def metric_groups(names: list[str]) -> dict[str, list[str]]:
    """Metric names by figure: the part before the first '/' (eval, rollout, time, ...);
    names without one go to ``train``."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        groups[name.split("/", 1)[0] if "/" in name else TRAIN_GROUP].append(name)
    return dict(groups)


def plot_metrics(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """One PNG per metric group (``<group>.png`` in out_dir, default RUN_DIR/plots): a
    grid of small panels, one per metric, titled with its name, x axis in steps.
    Evaluation metrics (few points) are drawn as points labelled with their values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = read_metrics(run_dir / "metrics.jsonl")
    out_dir = out_dir or run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, names in metric_groups(list(series)).items():
        columns = min(COLUMNS, len(names))
        rows = -(-len(names) // columns)
        figure, grid = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.6 * rows),
                                    squeeze=False)
        for axes, name in zip(grid.flat, names):
            _panel(axes, name, series[name])
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        for axes in list(grid.flat)[len(names):]:
            axes.set_visible(False)
        figure.suptitle(f"{run_dir.name}: {group}", fontsize=11)
        figure.tight_layout()
        target = out_dir / f"{group}.png"
        staging = target.with_suffix(".tmp.png")
        figure.savefig(staging, dpi=100)
        plt.close(figure)
        os.replace(staging, target)
        written.append(target)
    return written


def _panel(axes: object, name: str, points: list[tuple[int, float]]) -> None:
    """One metric: a line (training metrics), or labelled points (evaluation)."""
    steps, values = zip(*points)
    if name.startswith(EVAL_PREFIX):
        axes.plot(steps, values, linestyle=":", marker="o", color="tab:orange")
        for step, value in points[-12:]:  # label the last ones; older labels would overlap
            axes.annotate(f"{value:.3g}", (step, value), textcoords="offset points",
                          xytext=(0, 5), ha="center", fontsize=7)
        axes.margins(y=0.25)
    else:
        axes.plot(steps, values, marker="." if len(steps) < 30 else None, linewidth=1.2)
    axes.set_title(name, fontsize=9)
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
