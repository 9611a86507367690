"""The training loop: it owns every optimizer, schedule, clip, step, evaluation and checkpoint.

The policy and each module a strategy declares with :meth:`Strategy.trained_modules` (a
PPO critic) get their own optimizer and lr schedule, built here from the ``trainer:``
section plus the module's overrides, clipped separately, stepped together after one
backward, and saved and restored together. Frozen modules (a reference) are put in eval
mode without gradients. After every optimizer step the new weights are published to the
run's rollout runner, at the step boundary.
"""

from __future__ import annotations

import math
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from astrai_core.checkpoints import training_state as ckpt
from astrai_core.checkpoints.sharded import has_sharded, load_sharded
from astrai_core.config.trainer import TrainerConfig
from astrai_core.distributed.fsdp import full_tensor
from astrai_core.distributed.worker_report import RankProgress
from astrai_core.distributed.metrics import MicroBatchRecord, NullMetricsLog, reduce_micro_batches
from astrai_core.errors import AstraiError
from astrai_core.log import get_logger
from astrai_core.trackers.report import RunReport, open_report
from astrai_core.training.batch_sources import TENSORS
from astrai_core.training.run_components import RunComponents
from astrai_core.training.evaluation import evaluate
from astrai_core.training.metrics import MetricsLog, Throughput, to_number
from astrai_core.training.optim import build_optimizer, build_scheduler
from astrai_core.training.phases import CHECKPOINT_SAVED, PhaseHook, no_hook
from astrai_core.training.push_check import check_logprob_mismatch
from astrai_core.training.progress import Clock, RunReporter
from astrai_core.training.signals import StopOnSignal, TrainingInterrupted
from astrai_core.training.strategy import Strategy

log = get_logger("astrai.trainer")
POLICY = "policy"
# A compute_loss metric: how many units (tokens, sequences) its mean loss averages over.
LOSS_WEIGHT = "loss_weight"


class TrainingDiverged(AstraiError):
    """The loss or gradient norm became NaN/inf."""

    exit_code = 3


@dataclass
class OptimizedModule:
    """One trained module with its optimizer, schedule and clipping limit."""

    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    max_grad_norm: float | None

    @classmethod
    def build(cls, name: str, module: nn.Module, config: TrainerConfig,
              max_grad_norm: float | None) -> OptimizedModule:
        optimizer = build_optimizer(list(module.named_parameters()), config)
        return cls(name, module, optimizer, build_scheduler(optimizer, config), max_grad_norm)

    def clip(self) -> float:
        """Clip the gradients to ``max_grad_norm``; returns their norm before clipping."""
        limit = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
        grads = [p for p in self.module.parameters() if p.requires_grad and p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, limit) if grads else torch.tensor(0.0)
        return full_tensor(norm).item()  # sharded gradients: the global norm

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def metric(self, what: str) -> str:
        """``grad_norm`` for the policy, ``critic/grad_norm`` for the others."""
        return what if self.name == POLICY else f"{self.name}/{what}"


class Trainer:
    """Runs ``strategy`` for ``trainer.max_steps`` optimizer steps."""

    def __init__(self, run: RunComponents, strategy: Strategy,
                 clock: Clock = time.monotonic, phase_hook: PhaseHook | None = None) -> None:
        self.run = run
        self.clock = clock  # the progress display's; injectable so tests need no timing
        self.phase_hook = phase_hook or no_hook  # called at each named phase (phases.py)
        self.cfg = run.trainer
        self.strategy = strategy
        for module in strategy.frozen_modules().values():
            module.eval().requires_grad_(False)
        self.modules = [OptimizedModule.build(POLICY, run.model, self.cfg, self.cfg.max_grad_norm)]
        for name, trained in strategy.trained_modules().items():
            config = self.cfg.model_copy(update=trained.overrides)
            limit = trained.grad_norm_limit(self.cfg.max_grad_norm)
            self.modules.append(OptimizedModule.build(name, trained.module, config, limit))
        self.source = strategy.batch_source()
        self.step = 0
        self.reporter: RunReporter | None = None
        # each step begun and finished, for a distributed launcher to name a frozen rank
        self.progress = RankProgress.of_this_process()

    # -- resume ---------------------------------------------------------------------
    def resume(self) -> int:
        """Restore the newest complete checkpoint; returns its step."""
        _, directory = ckpt.latest_checkpoint(self.run.output_dir)  # verified: sizes, sha256
        state = ckpt.load_training_state(directory)
        if has_sharded(directory):  # modules and optimizers, resharded to this world size
            load_sharded(directory, self.modules)
        else:  # a checkpoint from before the sharded format
            ckpt.load_model_weights(self.run.model, directory)
            ckpt.load_extra_modules(directory, self._saved_modules())
            for trained in self.modules:
                trained.optimizer.load_state_dict(state["optimizers"][trained.name])
        for trained in self.modules:
            trained.scheduler.load_state_dict(state["schedulers"][trained.name])
        batches = dict(state["batches"])
        tensors = ckpt.load_state_tensors(directory)
        if tensors is not None:
            batches[TENSORS] = tensors
        self.source.load_state_dict(batches)
        self.strategy.load_state_dict(state["strategy"])
        if self.run.rollouts is not None:
            self.run.rollouts.sync_from(self.run.model)
        ranks = state.get("rng_ranks") or [state["rng"]]  # a new rank continues rank 0's
        dist = self.run.dist
        ckpt.restore_rng_state(ranks[dist.rank] if dist.rank < len(ranks) else ranks[0],
                               self.run.backend)
        self.step = int(state["step"])
        log.info("resumed", checkpoint=str(directory), step=self.step)
        return self.step

    def save(self) -> None:
        target = ckpt.checkpoint_dir(self.run.output_dir, self.step)
        if target.exists():  # the final step can coincide with a periodic save
            return
        batches = self.source.state_dict()
        tensors = batches.pop(TENSORS, None)
        rng = ckpt.rng_state(self.run.backend)
        state = {  # the same on every rank but the RNG (the rollout and positions are global)
            "step": self.step,
            "schedulers": {m.name: m.scheduler.state_dict() for m in self.modules},
            "batches": batches,
            "strategy": self.strategy.state_dict(),
            "rng": rng,
            "rng_ranks": self.run.dist.all_gather_object(rng),
        }
        ckpt.save_checkpoint(target, model=self.run.model, tokenizer_dir=self.run.tokenizer_dir,
                             extra_modules=self._saved_modules(), training_state=state,
                             summary={"step": self.step, "max_steps": self.cfg.max_steps},
                             initial_model_dir=self.run.initial_model_dir, state_tensors=tensors,
                             sharded_modules=self.modules, dist=self.run.dist,
                             phase_hook=self.phase_hook, step=self.step,
                             strategy=self.run.plan.strategy.name)
        self.phase_hook(CHECKPOINT_SAVED, self.step)  # tests of exact resume kill the run here
        if self.run.dist.is_main:
            ckpt.prune_checkpoints(self.run.output_dir, self.cfg.keep_last)
        log.info("checkpoint saved", path=str(target))

    def _saved_modules(self) -> dict[str, nn.Module]:
        """Every trained module a checkpoint holds besides the policy."""
        return {m.name: m.module for m in self.modules if m.name != POLICY}

    # -- the loop -------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to ``max_steps``; returns the last logged metrics."""
        start = self.resume() if resume else 0
        main = self.run.dist.is_main  # rank 0 alone writes metrics.jsonl and the terminal
        metrics_log = MetricsLog(self.run.output_dir, start if resume else None) if main \
            else NullMetricsLog()
        # metrics.jsonl, then the trackers of trainer.report_to (rank 0 alone reports)
        metrics_log = open_report(metrics_log, self.run.plan.trackers if main else (),
                                  config=self.run.plan.config.model_dump(mode="json"),
                                  output_dir=self.run.output_dir,
                                  resume_step=start if resume else None)
        if main and getattr(self.run.rollouts, "sample_log", None) is not None:
            self.run.rollouts.sample_log.report = metrics_log  # rollout.log_samples
        self.reporter = RunReporter(self.cfg.max_steps, start, bar=self.cfg.progress and main,
                                    heartbeat_seconds=self.cfg.heartbeat_seconds if main else 0,
                                    clock=self.clock)
        last: dict[str, Any] = {}
        evaluation: dict[str, Any] = {}
        status = "failed"
        try:
            if not resume and self.cfg.eval_at_start:
                last = evaluation = self._evaluate()
                metrics_log.write(0, last)
            with StopOnSignal() as stop:
                while self.step < self.cfg.max_steps:
                    last = self._one_step(metrics_log)
                    evaluation = {k: v for k, v in last.items() if k.startswith("eval/")} \
                        or evaluation
                    # every rank stops after the same step (one signalled rank suffices)
                    if self.run.dist.any(stop.received is not None) \
                            and self.step < self.cfg.max_steps:
                        status = "interrupted"
                        self._stop(stop)
            status = "finished"
        except KeyboardInterrupt:  # Ctrl-C outside StopOnSignal (the first evaluation)
            status = "interrupted"
            raise
        finally:
            self.reporter.close()
            metrics_log.close(status)
        kept = ckpt.list_checkpoints(self.run.output_dir)
        if main:
            self.reporter.summary(steps=self.step, last=last, evaluation=evaluation,
                                  checkpoint=kept[-1][1] if kept else None)
        return last

    def _one_step(self, metrics_log: MetricsLog | RunReport) -> dict[str, Any]:
        self.progress.began(self.step + 1)
        throughput = Throughput()
        metrics = self._train_step()
        self.step += 1
        if self.run.rollouts is not None:  # rollouts from a stale sampler stop the run
            check_logprob_mismatch(metrics, self.run.plan.config.rollout.max_logprob_diff,
                                   self.run.plan.sampler.name, self.step, self.run.dist)
        self.strategy.after_optimizer_step(self.step)
        if self.run.rollouts is not None:
            self.run.rollouts.publish_from(self.run.model)
            metrics.update(self.run.rollouts.sampler_metrics())  # e.g. weight-push times
        seconds, tokens_per_s = throughput.lap(metrics.get("tokens", 0))
        metrics["time/step_seconds"] = seconds
        metrics["throughput/tokens_per_s"] = tokens_per_s
        self.reporter.step(self.step, float(metrics["loss"]), float(metrics.get("tokens", 0)),
                           tokens_per_s)
        if self._due(self.cfg.eval_every):
            metrics.update(self._evaluate())
        # Logged before the checkpoint: a run killed right after a checkpoint has
        # logged every step it holds (a resume drops lines past its checkpoint).
        if self.step % self.cfg.log_every == 0 or self.step == self.cfg.max_steps:
            metrics_log.write(self.step, metrics)
        if self._due(self.cfg.save_every):
            self.save()
        self.progress.finished(self.step)
        return metrics

    def _stop(self, stop: StopOnSignal) -> None:
        """A signal arrived during the step just finished: checkpoint it, then stop."""
        if self.cfg.checkpoint_on_signal:
            self.save()
            saved = (f"saved {ckpt.checkpoint_dir(self.run.output_dir, self.step)}; "
                     "continue with --resume")
        else:
            saved = "no checkpoint written (trainer.checkpoint_on_signal is off)"
        # another rank's signal stops this one too: it reports SIGTERM, as a scheduler sends
        raise TrainingInterrupted(stop.received or signal.SIGTERM, f"stopped by "
                                  f"{stop.name or 'SIGTERM'} after step {self.step}: {saved}")

    def _due(self, every: int) -> bool:
        return self.step == self.cfg.max_steps or (every > 0 and self.step % every == 0)

    def _train_step(self) -> dict[str, Any]:
        for trained in self.modules:
            trained.module.train()
        micro_batches = self.source.next_step()
        dist = self.run.dist
        # context parallel, a strategy whose loss is the whole rows' on every rank of a
        # context group (not its token shard's) counts the group once
        copies = 1 if self.run.plan.needs.loss_on_token_shards else dist.context_size
        records, weighted = backward_micro_batches(self.strategy, micro_batches,
                                                   self.run.autocast, dist, self._diverged,
                                                   copies=copies)
        records = reduce_micro_batches(records, dist)  # the global values (identity: 1 rank)
        sums, total = step_sums(records, weighted, len(micro_batches))
        if weighted:  # the gradient reduction already averaged over the ranks
            self._unweight(total / dist.world_size)
        for trained in self.modules:
            norm = trained.clip()
            if not math.isfinite(norm):
                self._diverged(f"the {trained.name}'s gradient norm is {norm}")
            sums[trained.metric("grad_norm")] = norm
        for trained in self.modules:
            trained.step()
            sums[trained.metric("lr")] = trained.scheduler.get_last_lr()[0]
        skipped = getattr(self.run.train_loader, "skipped", 0)  # prompts too long to fit
        if skipped:
            sums["data/prompts_skipped"] = skipped
        return {**sums, **self.source.stats, **self.strategy.step_metrics()}

    def _unweight(self, total: float) -> None:
        """Each micro-batch loss that reports a ``loss_weight`` (the tokens or rows its mean
        runs over) was backpropagated times that weight; dividing the summed gradients by
        the step's total makes the step's gradient that of one batch of all of them."""
        for trained in self.modules:
            for param in trained.module.parameters():
                if param.grad is not None:
                    param.grad.div_(total)

    def _diverged(self, what: str) -> None:
        good = ckpt.last_good_checkpoint(self.run.output_dir)  # one whose manifest verifies
        last_good = str(good) if good is not None else "none yet"
        raise TrainingDiverged(
            f"training diverged at step {self.step + 1}: {what}. Nothing was saved for this "
            f"step; the last good checkpoint is {last_good}. Lower trainer.lr, enable "
            "trainer.max_grad_norm, or check the data."
        )

    def _evaluate(self) -> dict[str, Any]:
        for trained in self.modules:
            trained.module.eval()
        try:
            with torch.no_grad():
                metrics = evaluate(self.run, self.strategy.compute_loss,
                                   progress=self.reporter.eval_progress,
                                   metric_names=tuple(getattr(self.strategy, "eval_metrics", ())))
        finally:
            for trained in self.modules:
                trained.module.train()
        self.reporter.eval_finished(self.step, metrics)
        return metrics


def backward_micro_batches(strategy: Strategy, micro_batches: list[Any], autocast: Any,
                           dist: Any, diverged: Any, copies: int = 1
                           ) -> tuple[list[MicroBatchRecord], bool]:
    """The backward pass of each micro-batch's loss, accumulating one step's gradients:
    (each micro-batch's record, whether the losses were weighted by their ``loss_weight``).
    ``diverged(what)`` raises on a non-finite loss. ``copies``: how many ranks compute
    each micro-batch's loss alike (a context group's, when the loss is the whole rows'):
    their weight and token count are shared among them."""
    accum = len(micro_batches)
    weights: list[float] = []  # loss weights, when the strategy reports them
    records: list[MicroBatchRecord] = []
    for index, batch in enumerate(micro_batches):
        with autocast():
            loss, metrics = strategy.compute_loss(batch)
        loss_value = loss.detach().item()
        if not torch.isfinite(loss.detach()):
            diverged(f"loss is {loss_value}")
        weight = metrics.pop(LOSS_WEIGHT, None)
        if copies > 1:
            weight = None if weight is None else to_number(weight) / copies
            if "tokens" in metrics:
                metrics["tokens"] = to_number(metrics["tokens"]) / copies
        # Distributed, each rank's loss is a mean over its share: weighted by it, the
        # sum over ranks and micro-batches divided by the global total (_unweight) is
        # the one-process gradient.
        if (accum > 1 or dist.enabled) and weight is not None and len(weights) == index:
            weights.append(float(to_number(weight)))
            (loss * weights[-1]).backward()
        else:
            (loss / accum).backward()
        records.append(MicroBatchRecord(loss_value, weights[-1] if len(weights) > index
                                        else None,
                                        {k: to_number(v) for k, v in metrics.items()}))
    if weights and len(weights) != accum:
        raise RuntimeError(f"{type(strategy).__name__}.compute_loss reported "
                           f"{LOSS_WEIGHT!r} for some micro-batches of a step only")
    return records, bool(weights)


def step_sums(records: list[MicroBatchRecord], weighted: bool, accum: int
              ) -> tuple[dict[str, float], float]:
    """The step's loss and metrics from its micro-batches' (global) records, and the total
    loss weight: weighted, the loss is the weighted mean, else the mean; ``tokens`` is a
    count summed over micro-batches, the other metrics are averaged."""
    sums: dict[str, float] = defaultdict(float)
    weights: list[float] = []
    for record in records:
        if weighted:
            weights.append(record.weight)
            sums["loss"] += record.loss * record.weight
        else:
            sums["loss"] += record.loss / accum
        for name, value in record.metrics.items():
            sums[name] += to_number(value) * (1 if name == "tokens" else 1 / accum)
    total = 0.0
    if weighted:
        total = sum(weights) or 1.0  # all zero: no targets, zero gradients anyway
        sums["loss"] /= total
    return sums, total
