"""Periodic evaluation, run by the trainer: held-out loss, or accuracy by generation.

The strategy takes no part beyond its ``compute_loss``, which the trainer passes in: a
prompt-format eval set is scored by greedy generation with the run's sampler and
rewards; any other is scored by the strategy's loss, weighted by tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from astrai_core.rollout.evaluate import evaluate_episodes, evaluate_generation
from astrai_core.training.run_components import RunComponents

LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, Any]]]
ProgressFn = Callable[[int, "int | None"], None]


def evaluate(run: RunComponents, compute_loss: LossFn,
             progress: ProgressFn | None = None,
             metric_names: tuple[str, ...] = ()) -> dict[str, float]:
    """`eval/...` metrics over `data.eval`, and `eval/<name>/...` over each of
    `data.eval_sets`; nothing when the run has no eval source.

    ``progress(done, total)`` is called after each batch: prompts done of all prompts
    for generation, batches done (of an unknown total) for the loss. ``metric_names``:
    metrics of ``compute_loss`` also reported as ``eval/<name>`` when scored by the loss
    (a strategy's ``eval_metrics``, e.g. a reward model's pair accuracy)."""
    metrics = _evaluate_loader(run, compute_loss, run.eval_loader, progress, metric_names) \
        if run.eval_loader is not None else {}
    for name, loader in run.eval_sets.items():
        named = _evaluate_loader(run, compute_loss, loader, progress, metric_names)
        metrics.update({f"eval/{name}/{key.removeprefix('eval/')}": value
                        for key, value in named.items()})
    return metrics


def _evaluate_loader(run: RunComponents, compute_loss: LossFn, loader: Any,
                     progress: ProgressFn | None,
                     metric_names: tuple[str, ...]) -> dict[str, float]:
    if loader.kind == "prompt":
        records = [record for batch in loader for record in batch]
        if run.episodes is not None:
            return evaluate_episodes(run.episodes, records,
                                     max_new_tokens=run.trainer.eval_max_new_tokens,
                                     batch_size=run.data.eval_batch_size or run.data.batch_size,
                                     progress=progress)
        return evaluate_generation(run.sampler, run.tokenizer, records, run.rewards,
                                   max_new_tokens=run.trainer.eval_max_new_tokens,
                                   batch_size=run.data.eval_batch_size or run.data.batch_size,
                                   progress=progress)
    return _loss_metrics(run, compute_loss, loader, progress, metric_names)


def _loss_metrics(run: RunComponents, compute_loss: LossFn, loader: Any,
                  progress: ProgressFn | None, metric_names: tuple[str, ...]) -> dict[str, float]:
    """Token-weighted mean of the strategy's loss over one pass of the eval data, and the
    mean of each of ``metric_names`` weighted by the ``loss_weight`` a batch reports (the
    rows its mean runs over), else by its tokens."""
    total, weight = 0.0, 0.0
    sums = dict.fromkeys(metric_names, 0.0)
    weights = dict.fromkeys(metric_names, 0.0)
    with torch.no_grad(), run.autocast():
        for done, batch in enumerate(loader, start=1):
            loss, metrics = compute_loss(batch)
            tokens = float(metrics.get("tokens", 1))
            total += loss.item() * tokens
            weight += tokens
            rows = float(metrics.get("loss_weight", tokens))
            for name in metric_names:
                if name in metrics:
                    sums[name] += float(metrics[name]) * rows
                    weights[name] += rows
            if progress is not None:
                progress(done, None)
    if not weight:
        return {}
    extra = {f"eval/{name}": sums[name] / weights[name] for name in metric_names if weights[name]}
    return {"eval/loss": total / weight, **extra}
