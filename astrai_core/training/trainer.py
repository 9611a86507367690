"""The training loop: accumulation, clipping, optimizer + schedule, eval, metrics, checkpoints."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from astrai_core.errors import AstraiError
from astrai_core.log import get_logger
from astrai_core.training import checkpointing as ckpt
from astrai_core.training import faults
from astrai_core.training.context import TrainContext
from astrai_core.training.metrics import MetricsLog, Progress, Throughput, to_number
from astrai_core.training.optim import build_optimizer, build_scheduler
from astrai_core.training.strategy import Strategy

log = get_logger("astrai.trainer")


class TrainingDiverged(AstraiError):
    """The loss or gradient norm became NaN/inf."""

    exit_code = 3


class Trainer:
    """Runs ``strategy`` for ``trainer.max_steps`` optimizer steps."""

    def __init__(self, context: TrainContext, strategy: Strategy) -> None:
        self.ctx = context
        self.cfg = context.trainer_config
        self.strategy = strategy
        self.strategy.setup()
        self.params = [p for p in context.model.parameters() if p.requires_grad]
        named = list(context.model.named_parameters())
        for prefix, module in strategy.extra_modules().items():
            named += [(f"{prefix}.{n}", p) for n, p in module.named_parameters()]
        self.optimizer = build_optimizer(named, self.cfg)
        self.clip_params = [p for _, p in named if p.requires_grad]
        self.scheduler = build_scheduler(self.optimizer, self.cfg)
        self.step = 0

    # -- resume ---------------------------------------------------------------------
    def resume(self) -> int:
        """Restore the newest complete checkpoint; returns its step."""
        directory = ckpt.latest_checkpoint(self.ctx.output_dir)
        ckpt.load_model_weights(self.ctx.model, directory)
        ckpt.load_extra_modules(directory, self._saved_modules())
        state = ckpt.load_training_state(directory)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.strategy.load_state_dict(state["strategy"])
        ckpt.restore_rng_state(state["rng"], self.ctx.backend)
        self.step = int(state["step"])
        log.info("resumed", checkpoint=str(directory), step=self.step)
        return self.step

    def save(self) -> None:
        target = ckpt.checkpoint_dir(self.ctx.output_dir, self.step)
        if target.exists():  # the final step can coincide with a periodic save
            return
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "strategy": self.strategy.state_dict(),
            "rng": ckpt.rng_state(self.ctx.backend),
        }
        ckpt.save_checkpoint(target, model=self.ctx.model, tokenizer_dir=self.ctx.tokenizer_dir,
                             extra_modules=self._saved_modules(), training_state=state,
                             summary={"step": self.step, "max_steps": self.cfg.max_steps},
                             initial_model_dir=self.ctx.initial_model_dir)
        faults.after_checkpoint_saved(self.step)  # tests of exact resume kill the run here
        ckpt.prune_checkpoints(self.ctx.output_dir, self.cfg.keep_last)
        log.info("checkpoint saved", path=str(target))

    def _saved_modules(self) -> dict[str, torch.nn.Module]:
        """Every strategy module a checkpoint holds besides the policy."""
        return {**self.strategy.extra_modules(), **self.strategy.checkpoint_modules()}

    # -- the loop -------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to ``max_steps``; returns the last logged metrics."""
        start = self.resume() if resume else 0
        metrics_log = MetricsLog(self.ctx.output_dir, start if resume else None)
        last: dict[str, Any] = {}
        if not resume and self.cfg.eval_at_start:
            last = self._evaluate()
            metrics_log.write(0, last)
        batches = self.strategy.train_batches()
        progress = Progress(self.cfg.max_steps, start, self.cfg.progress)
        throughput = Throughput()
        try:
            while self.step < self.cfg.max_steps:
                metrics = self._train_step(batches)
                self.step += 1
                self.strategy.after_optimizer_step(self.step)
                seconds, tokens_per_s = throughput.lap(metrics.get("tokens", 0))
                metrics["time/step_seconds"] = seconds
                metrics["throughput/tokens_per_s"] = tokens_per_s
                if self._due(self.cfg.eval_every):
                    metrics.update(self._evaluate())
                if self._due(self.cfg.save_every):
                    self.save()
                if self.step % self.cfg.log_every == 0 or self.step == self.cfg.max_steps:
                    metrics_log.write(self.step, metrics)
                progress.update(self.step, float(metrics["loss"]),
                                metrics["throughput/tokens_per_s"])
                last = metrics
                throughput.restart()
        finally:
            progress.close()
        return last

    def _due(self, every: int) -> bool:
        return self.step == self.cfg.max_steps or (every > 0 and self.step % every == 0)

    def _train_step(self, batches: Iterator[Any]) -> dict[str, Any]:
        self.ctx.model.train()
        sums: dict[str, float] = defaultdict(float)
        accum = self.cfg.grad_accum_steps
        for _ in range(accum):
            batch = next(batches)
            with self.ctx.autocast():
                loss, metrics = self.strategy.compute_loss(batch)
            loss_value = loss.detach().item()
            if not torch.isfinite(loss.detach()):
                self._diverged(f"loss is {loss_value}")
            (loss / accum).backward()
            sums["loss"] += loss_value / accum
            for name, value in metrics.items():
                # "tokens" is a count summed over micro-batches; the rest are averaged
                sums[name] += to_number(value) * (1 if name == "tokens" else 1 / accum)
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums["grad_norm"] = grad_norm
        sums["lr"] = self.scheduler.get_last_lr()[0]
        return {**sums, **self.strategy.step_metrics()}

    def _clip_gradients(self) -> float:
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else float("inf")
        grads = [p for p in self.clip_params if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, max_norm) if grads else torch.tensor(0.0)
        if not torch.isfinite(norm):
            self._diverged(f"gradient norm is {norm.item()}")
        return norm.item()

    def _diverged(self, what: str) -> None:
        kept = ckpt.list_checkpoints(self.ctx.output_dir)
        last_good = str(kept[-1][1]) if kept else "none yet"
        raise TrainingDiverged(
            f"training diverged at step {self.step + 1}: {what}. Nothing was saved for this "
            f"step; the last good checkpoint is {last_good}. Lower trainer.lr, enable "
            "trainer.max_grad_norm, or check the data."
        )

    def _evaluate(self) -> dict[str, Any]:
        self.ctx.model.eval()
        try:
            with torch.no_grad():
                return self.strategy.evaluate()
        finally:
            self.ctx.model.train()
