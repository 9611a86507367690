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


def plot_metrics(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write one PNG per metric group (the part before '/', e.g. eval, moe) into out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(run_dir / "metrics.jsonl")
    out_dir = out_dir or run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(series):
        groups[name.split("/", 1)[0] if "/" in name else name].append(name)
    written = []
    for group, names in groups.items():
        figure, axes = plt.subplots(figsize=(7, 4))
        for name in names:
            steps, values = zip(*series[name])
            axes.plot(steps, values, marker="." if len(steps) < 50 else None, label=name)
        axes.set_xlabel("step")
        axes.set_title(group)
        axes.grid(alpha=0.3)
        if len(names) > 1:
            axes.legend(fontsize="small")
        figure.tight_layout()
        target = out_dir / f"{group.replace('/', '_')}.png"
        staging = target.with_suffix(".tmp.png")
        figure.savefig(staging, dpi=100)
        plt.close(figure)
        os.replace(staging, target)
        written.append(target)
    return written
