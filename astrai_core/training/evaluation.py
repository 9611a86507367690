"""Periodic evaluation, run by the trainer: held-out loss, or accuracy by generation.

The strategy takes no part beyond its ``compute_loss``, which the trainer passes in: a
prompt-format eval set is scored by greedy generation with the run's sampler and
rewards; any other is scored by the strategy's loss, weighted by tokens.

Distributed, the work is split over the ranks and the result is the one-process
evaluation's (up to summation order): each rank scores every world_size-th prompt (on
one gathering of the policy) or every world_size-th batch, and the sums or means are
combined over the ranks. Under FSDP a forward is a collective, so in a round where a rank
has no batch left it runs its first batch again and discards the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import contextlib
import math

import torch

from astrai_core.distributed.fsdp import UnshardedSampler
from astrai_core.distributed.metrics import combine_shares
from astrai_core.rollout.evaluate import evaluate_episodes, evaluate_generation
from astrai_core.sampling.params import SamplingParams
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
        return _generation_metrics(run, loader, progress)
    return _loss_metrics(run, compute_loss, loader, progress, metric_names)


def _generation_metrics(run: RunComponents, loader: Any,
                        progress: ProgressFn | None) -> dict[str, float]:
    """Greedy generation over this rank's share of the prompts, combined over the ranks
    (every metric is a mean over prompts, or over their equally many completions)."""
    records = [record for batch in loader for record in batch]
    mine = records[run.dist.rank::run.dist.world_size]
    batch_size = run.data.eval_batch_size or run.data.batch_size
    # a sampler of the sharded policy (wrapped by the run) gathers it once for them all
    gathered = run.sampler.gathered if isinstance(run.sampler, UnshardedSampler) else None
    if gathered is None and run.dist.enabled:
        # A sampler apart from the trainer (ray) serves the ranks in step: one request of
        # each rank's whole share, an empty one where a rank has no prompt.
        batch_size = max(1, math.ceil(len(records) / run.dist.world_size))
        if not mine:
            run.sampler.generate([], SamplingParams(max_new_tokens=1))
    metrics: dict[str, float] = {}
    with (gathered or contextlib.nullcontext)():  # one gathering of the policy per rank
        if mine and run.episodes is not None:
            metrics = evaluate_episodes(run.episodes, mine,
                                        max_new_tokens=run.trainer.eval_max_new_tokens,
                                        batch_size=batch_size, progress=progress)
        elif mine:
            metrics = evaluate_generation(run.sampler, run.tokenizer, mine, run.rewards,
                                          max_new_tokens=run.trainer.eval_max_new_tokens,
                                          batch_size=batch_size, progress=progress)
    return combine_shares(run.dist, len(mine), metrics)


def _loss_metrics(run: RunComponents, compute_loss: LossFn, loader: Any,
                  progress: ProgressFn | None, metric_names: tuple[str, ...]) -> dict[str, float]:
    """Token-weighted mean of the strategy's loss over one pass of the eval data, and the
    mean of each of ``metric_names`` weighted by the ``loss_weight`` a batch reports (the
    rows its mean runs over), else by its tokens."""
    dist = run.dist
    batches = list(loader) if dist.enabled else loader
    rounds = math.ceil(len(batches) / dist.data_world) if dist.enabled else None
    sums = {name: 0.0 for name in ("loss", "tokens", *metric_names, *map(_weight, metric_names))}
    with torch.no_grad(), run.autocast():
        for done, batch in enumerate(_my_batches(batches, dist, rounds), start=1):
            loss, metrics = compute_loss(batches[0] if batch is None else batch)
            if batch is None:  # the forward only kept this rank in step with the others
                continue
            tokens = float(metrics.get("tokens", 1))
            sums["loss"] += loss.item() * tokens
            sums["tokens"] += tokens
            rows = float(metrics.get("loss_weight", tokens))
            for name in metric_names:
                if name in metrics:
                    sums[name] += float(metrics[name]) * rows
                    sums[_weight(name)] += rows
            if progress is not None:
                progress(done, None)
    sums = dict(zip(sums, dist.all_reduce_sum(list(sums.values())), strict=True))
    if not sums["tokens"]:
        return {}
    extra = {f"eval/{name}": sums[name] / sums[_weight(name)] for name in metric_names
             if sums[_weight(name)]}
    return {"eval/loss": sums["loss"] / sums["tokens"], **extra}


def _weight(name: str) -> str:
    return f"weight of {name}"


def _my_batches(batches: Any, dist: Any, rounds: int | None) -> Any:
    """This rank's batches (every data_world-th: a context group's ranks share theirs),
    one per round; None in a round where it has none left. One process: the loader."""
    if rounds is None:
        yield from batches
        return
    for index in range(rounds):
        position = index * dist.data_world + dist.data_rank
        yield batches[position] if position < len(batches) else None
