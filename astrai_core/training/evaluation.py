"""Periodic evaluation: held-out loss, or accuracy by generation for prompt data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from astrai_core.training.context import TrainContext
    from astrai_core.training.strategy import Strategy


def evaluate_run(ctx: TrainContext, strategy: Strategy) -> dict[str, float]:
    """`eval/...` metrics over `data.eval`; nothing when the run has no eval source."""
    from astrai_core.data import build_eval_loader

    loader = build_eval_loader(ctx.data_config, ctx.tokenizer, base_dir=ctx.base_dir)
    if loader is None:
        return {}
    if loader.kind == "prompt":
        return _generation_metrics(ctx, [record for batch in loader for record in batch])
    return _loss_metrics(ctx, strategy, loader)


def _generation_metrics(ctx: TrainContext, records: list[Any]) -> dict[str, float]:
    from astrai_core.rollout.evaluate import evaluate_generation

    return evaluate_generation(ctx.sampler(), ctx.tokenizer, records, ctx.rewards(),
                               max_new_tokens=ctx.trainer_config.eval_max_new_tokens,
                               batch_size=ctx.data_config.eval_batch_size
                               or ctx.data_config.batch_size)


def _loss_metrics(ctx: TrainContext, strategy: Strategy, loader: Any) -> dict[str, float]:
    """Token-weighted mean of the strategy's loss over one pass of the eval data."""
    total, weight = 0.0, 0.0
    with torch.no_grad(), ctx.autocast():
        for batch in loader:
            loss, metrics = strategy.compute_loss(batch)
            tokens = float(metrics.get("tokens", 1))
            total += loss.item() * tokens
            weight += tokens
    return {"eval/loss": total / weight} if weight else {}
