"""The `trainer:` section of a run config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from astrai_core.config.component import ComponentSection


class TrainerConfig(BaseModel):
    """Optimisation, schedule, precision, logging, evaluation and checkpoint cadence."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(gt=0, description="optimizer steps to run")
    lr: float = Field(1e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / peak lr (cosine, linear)")
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    optimizer: Literal["adamw", "muon"] = "adamw"
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    muon_lr: float | None = Field(None, gt=0, description="Muon's lr (default: lr)")
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    muon_experts: bool = Field(
        False, description="with muon, also orthogonalize each MoE expert's matrices "
        "(off: the fused 3-D expert tensors train with AdamW)")
    grad_accum_steps: int = Field(1, ge=1)
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="online strategies: pack each optimizer step's rollout rows "
        "without padding into micro-batches of at most this many tokens per process (in "
        "place of grad_accum_steps); null = padded micro-batches")
    share_prompt: bool = Field(
        False, description="online strategies: the completions of a group compute their "
        "shared prompt once in every forward over the rollout (training, old log-probs, "
        "reference, critic), its keys and values attended to by each completion (native "
        "model)")
    max_grad_norm: float | None = Field(1.0, gt=0, description="None disables clipping")
    mixed_precision: Literal["no", "bf16"] = Field(
        "no", description="autocast compute dtype (bf16); fp16 is not offered: it needs loss "
        "scaling, and bf16 trains without it")
    seed: int = 0
    threads: int | None = Field(
        1, ge=1, description="torch CPU threads (intra-op) for the run; fixed so that a run "
        "repeats bit for bit on machines with other core counts (on CPU the thread count "
        "changes the sampler's log-probs in the last bits); null = torch's default (one "
        "per physical core)")
    deterministic: bool = Field(
        True, description="on a CPU device, torch.use_deterministic_algorithms (warn-only: "
        "an op without a deterministic kernel warns instead of failing)")
    log_every: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0, description="0 = only at the end")
    eval_at_start: bool = True
    save_every: int = Field(0, ge=0, description="0 = only at the end")
    keep_last: int | None = Field(None, ge=1, description="delete older checkpoints")
    eval_max_new_tokens: int = Field(16, ge=1, description="generation length for eval/accuracy")
    progress: bool = Field(True, description="on a terminal, show a live progress bar")
    heartbeat_seconds: float = Field(
        30.0, ge=0, description="without a progress bar (off a terminal: CI, nohup, a pipe; "
        "or progress: false), log a progress line (step, loss, tokens/s, ETA) at most this "
        "often, in seconds; 0 = never")
    checkpoint_on_signal: bool = Field(
        True, description="on SIGINT/SIGTERM, finish the current step, save a checkpoint, "
        "and exit with 130/143; a second signal stops at once")
    report_to: list[ComponentSection] = Field(
        default_factory=list, description="trackers that get the config and every logged "
        "metric besides metrics.jsonl: names (`[tensorboard, wandb]`) or entries with "
        "options (`{name: wandb, project: demo, mode: offline}`); see docs/trackers.md")

    @field_validator("report_to", mode="before")
    @classmethod
    def _names_to_entries(cls, value: Any) -> Any:
        if isinstance(value, str):  # `report_to: wandb` or `--set trainer.report_to=wandb`
            value = [value]
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.warmup_steps > self.max_steps:
            raise ValueError("warmup_steps must not exceed max_steps")
        return self
