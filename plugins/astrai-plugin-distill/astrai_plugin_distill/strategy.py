"""The ``distill`` strategy: knowledge distillation from a frozen teacher checkpoint.

Data: ``chat`` rows (a conversation ending with an assistant reply). Each step, a share
``on_policy_fraction`` of the rows get the student's own completion of their prompt from
the run's sampler (GKD's lambda; :mod:`astrai_plugin_distill.onpolicy`); the others keep
the dataset's reply. 0 never samples (no sampler is built for it), 1 trains on student
samples only. On every row, teacher and student score the same response tokens and the
per-token divergence (:mod:`astrai_plugin_distill.losses`) is aggregated with
``loss_aggregation``, as the other strategies aggregate their token losses. ``sft_coef``
adds the student's cross-entropy on the dataset's replies (not on its own samples) to
the divergence, token by token: the hard-label term of classic knowledge distillation.
``teacher_correct_only`` keeps the divergence off the dataset rows whose reply the
teacher would not write itself (its most likely token differs from the reply somewhere),
so that the student learns from the teacher only where the teacher is right, as
distillation from verified teacher answers does; those rows keep the cross-entropy.

The teacher is frozen beside the policy (the trainer holds it like a reference and, in a
distributed run, shards it). Both distributions go through the chunked head: the loss is
the student's head (:mod:`astrai_plugin_distill.forward`), so no [B, S, V] logits exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, model_validator
from torch import Tensor

from astrai_core.api import (
    AuxLossOption,
    BatchSource,
    FieldError,
    LossAggregationOptions,
    RunComponents,
    RunConfig,
    Strategy,
    StrategyNeeds,
    aggregate_loss,
    launched_world_size,
    merged_state_dict,
)
from astrai_plugin_distill.forward import student_token_losses
from astrai_plugin_distill.losses import token_loss, with_nll
from astrai_plugin_distill.onpolicy import OnPolicyMix
from astrai_plugin_distill.teacher import check_teacher, load_teacher, teacher_head


class DistillConfig(AuxLossOption, LossAggregationOptions):
    """The ``strategy:`` section of a distill run (``loss_aggregation``'s sequences are
    its rows)."""

    teacher: Path = Field(description="the teacher's checkpoint directory (shares the "
                          "student's tokenizer)")
    loss: Literal["reverse_kl", "forward_kl", "jsd"] = Field(
        "jsd", description="reverse_kl: KL(student || teacher); forward_kl: "
        "KL(teacher || student), on the teacher's top_k tokens when given; jsd: GKD's "
        "generalized JSD with beta")
    beta: float = Field(0.5, ge=0, le=1, description="jsd: the teacher's weight in the "
                        "mixture (0 = forward KL, 1 = reverse KL)")
    top_k: int | None = Field(None, ge=1, description="forward_kl: the teacher's most likely "
                              "tokens the KL runs over, renormalised (default: the whole "
                              "vocabulary)")
    temperature: float = Field(1.0, gt=0, description="softens both distributions: "
                               "softmax(logits / temperature)")
    on_policy_fraction: float = Field(
        0.5, ge=0, le=1, description="share of each batch's rows whose reply is the student's "
        "own sample (0: dataset replies only, no sampling; 1: student samples only)")
    estimator: Literal["exact", "sampled"] = Field(
        "exact", description="reverse_kl: exact over the vocabulary, or the sampled-token "
        "estimate log p_s - log p_t (needs on_policy_fraction: 1)")
    sft_coef: float = Field(
        0.0, ge=0, description="weight of the student's cross-entropy on the dataset's "
        "replies, added to the divergence on those tokens (0: the teacher alone)")
    teacher_correct_only: bool = Field(
        False, description="dataset rows: the divergence only on rows whose every reply "
        "token is the teacher's most likely token (the others learn from the labels alone; "
        "needs sft_coef)")

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        given = self.model_fields_set
        if "beta" in given and self.loss != "jsd":
            raise ValueError(f"beta applies to loss: jsd, not {self.loss}")
        if self.top_k is not None and self.loss != "forward_kl":
            raise ValueError(f"top_k applies to loss: forward_kl, not {self.loss}")
        if self.estimator == "sampled" and self.loss != "reverse_kl":
            raise ValueError("estimator: sampled applies to loss: reverse_kl")
        if self.estimator == "sampled" and self.on_policy_fraction != 1:
            raise ValueError("estimator: sampled estimates the KL from the student's own "
                             "samples, so it needs on_policy_fraction: 1")
        if self.teacher_correct_only and not self.sft_coef:
            raise ValueError("teacher_correct_only leaves rows to the labels' cross-entropy, "
                             "so it needs sft_coef > 0")
        if self.sft_coef and self.on_policy_fraction == 1:
            raise ValueError("sft_coef weighs the cross-entropy on the dataset's replies, and "
                             "on_policy_fraction: 1 leaves none")
        return self


class Distill(Strategy):
    """Distillation from a frozen teacher; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = DistillConfig
    data_formats: ClassVar[tuple[str, ...]] = ("chat",)

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        samples = config.on_policy_fraction > 0
        return StrategyNeeds(data_formats=cls.data_formats, generates=samples,
                             unpacked_rows="with on_policy_fraction > 0 samples a reply to "
                             "each row's prompt" if samples else None,
                             context_parallel=True)  # whole rows' token losses, gathered

    @classmethod
    def check_run(cls, config: Any, run_config: RunConfig) -> None:
        check_teacher(config.teacher, run_config.model)
        splits = run_config.parallel.context_parallel > 1 and launched_world_size() > 1
        if splits and config.on_policy_fraction:
            raise FieldError(("parallel", "context_parallel"), "distill splits rows' tokens "
                             "over ranks on dataset replies only; use strategy."
                             "on_policy_fraction: 0 with it")

    def __init__(self, config: DistillConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.teacher = load_teacher(config.teacher, run.device)
        divergence = token_loss(config.loss, beta=config.beta, top_k=config.top_k,
                                temperature=config.temperature, estimator=config.estimator)
        self.token_loss = with_nll(divergence) if config.sft_coef else divergence

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {"teacher": self.teacher}

    def batch_source(self) -> BatchSource:
        source = super().batch_source()
        if self.config.on_policy_fraction == 0:
            return source
        run = self.run
        pad_id = getattr(run.tokenizer, "pad_token_id", None) or 0
        rows = run.data.batch_size
        return OnPolicyMix(source, run.sampler, run.sampling, self.config.on_policy_fraction,
                           batch_rows=rows, first_row=run.dist.rank_slice(rows).start,
                           pad_token_id=pad_id)

    def after_optimizer_step(self, step: int) -> None:
        """The sampler gets the new weights: one that reads them from the live policy
        (it declares ``shares_policy``: torch, vllm, ray) is told they changed in place;
        another gets the policy's state dict (a LoRA policy's merged)."""
        sampler = self.run.sampler
        if self.config.on_policy_fraction and sampler is not None:
            shared = self.run.sampler_capabilities.shares_policy
            sampler.update_weights(None if shared else merged_state_dict(self.run.model))

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        batch = self.to_device(batch)
        ids = batch["input_ids"]
        mask = batch["loss_mask"][:, 1:].bool()  # response tokens, by predicting position
        forward = {"attention_mask": batch.get("attention_mask"),
                   "position_ids": batch.get("position_ids")}
        # context parallel: each rank scores its shard of the tokens, and every rank of the
        # group gets the whole rows' token losses (the trainer counts the group once)
        dist = self.run.dist
        teacher_side = teacher_head(self.teacher, ids, mask, dist, **forward)
        out = student_token_losses(self.run.model, ids, mask, teacher_side, self.token_loss,
                                   dist, **forward)
        token_loss, metrics = out["token_loss"], {}
        if self.config.sft_coef:  # [M, 3]: the divergence, the NLL, the teacher agreeing
            token_loss = self._with_sft(token_loss, batch, mask, metrics)
        per_token = torch.zeros(mask.shape, dtype=token_loss.dtype,
                                device=mask.device).masked_scatter(mask, token_loss)
        cfg = self.config
        loss = aggregate_loss(per_token, mask, cfg.loss_aggregation, cfg.norm_length)
        metrics.update({"distill_loss": loss.detach(), "tokens": mask.sum(),
                        "loss_weight": self._loss_weight(mask)})
        return self.add_aux_loss(loss, out.get("aux_loss"), metrics), metrics

    def _with_sft(self, columns: Tensor, batch: dict[str, Tensor], mask: Tensor,
                  metrics: dict[str, Any]) -> Tensor:
        """The per-token loss with ``sft_coef`` x NLL on dataset replies' tokens (and, with
        ``teacher_correct_only``, no divergence on dataset rows the teacher gets wrong)."""
        divergence, nll, agrees = columns.unbind(-1)
        on_policy = batch.get("on_policy")
        rows = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device) \
            if on_policy is None else on_policy.to(mask.device).bool()
        dataset = (~rows)[:, None].expand_as(mask)[mask].to(nll.dtype)
        metrics["sft_nll"] = ((nll * dataset).sum() / dataset.sum().clamp(min=1)).detach()
        if self.config.teacher_correct_only:
            wrong = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
            wrong[mask] = agrees < 0.5
            trusted = rows | ~wrong.any(-1)  # on-policy rows, and rows the teacher gets right
            metrics["distill/teacher_correct_rows"] = (~wrong.any(-1) & ~rows).sum().float()
            divergence = divergence * trusted[:, None].expand_as(mask)[mask].to(nll.dtype)
        metrics["divergence"] = divergence.detach().mean()
        return divergence + self.config.sft_coef * nll * dataset

    def _loss_weight(self, mask: Tensor) -> Tensor:
        """What the aggregated loss averages over (tokens or rows): the trainer weights
        accumulated micro-batches and ranks by it."""
        if self.config.loss_aggregation == "token-mean":
            return mask.sum()
        return torch.tensor(float(mask.shape[0]))
