"""`astrai plot`: one figure per metric group, one small panel per metric."""

from __future__ import annotations

import json

import matplotlib.image

from astrai_core.training.plot import metric_groups, plot_metrics


def test_one_figure_per_group_and_one_panel_per_metric(tmp_path):
    lines = []
    for step in range(1, 21):
        record = {"step": step, "loss": 3.0 / step, "grad_norm": 1.0, "lr": 1e-3,
                  "tokens": 100, "rollout/reward_mean": step / 20}
        if step % 10 == 0:
            record.update({"eval/accuracy": step / 40, "eval/reward": step / 30,
                           "eval/reward/exact_match": step / 40, "eval/response_length": 9.0})
        lines.append(json.dumps(record))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert metric_groups(["loss", "lr", "eval/accuracy", "eval/reward/exact_match",
                          "rollout/reward_mean"]) == {
        "eval": ["eval/accuracy", "eval/reward/exact_match"], "train": ["loss", "lr"],
        "rollout": ["rollout/reward_mean"]}
    written = plot_metrics(tmp_path)
    assert sorted(p.name for p in written) == ["eval.png", "rollout.png", "train.png"]
    # 4 panels: 2 rows of 3 columns (3.6 x 2.6 inches each at 100 dpi); 1 panel: 1 x 1
    assert matplotlib.image.imread(tmp_path / "plots" / "train.png").shape[:2] == (520, 1080)
    assert matplotlib.image.imread(tmp_path / "plots" / "eval.png").shape[:2] == (520, 1080)
    assert matplotlib.image.imread(tmp_path / "plots" / "rollout.png").shape[:2] == (260, 360)
