"""The shape of a run config: its sections, their types and their defaults.

Every section is typed here, torch-free: `model`, `data` and `trainer` are checked when
the file is read. Pluggable sections (`strategy`, `advantage`, `rewards`, `sampler`,
`device`, `environment`) select a component by `name`; their other keys belong to that component and
are validated against its own `Config` model by the run plan (plan.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from astrai_core.config.component import ComponentSection
from astrai_core.config.lora import LoraSection
from astrai_core.config.parallel import ParallelConfig
from astrai_core.config.trainer import TrainerConfig
from astrai_core.data.config import DataConfig


class Section(BaseModel):
    """A config section with a fixed set of fields."""

    model_config = ConfigDict(extra="forbid")


class RewardSection(ComponentSection):
    """A reward function with its weight in the summed reward."""

    weight: float = 1.0


class ModelSection(Section):
    """Either a model to start from (`path`) or a from-scratch architecture (`config`)."""

    path: str | None = Field(
        default=None, description="an astrai checkpoint, a Hugging Face checkpoint directory, "
        "or a hub id (owner/name, found through the Hugging Face cache)")
    backend: Literal["native", "transformers"] | None = Field(
        default=None, description="what runs the model: native (astrai's decoder; a Hugging "
        "Face directory is imported on the fly) or transformers (any AutoModelForCausalLM); "
        "default: native where an importer takes the model_type, else transformers")
    trust_remote_code: bool = Field(
        default=False, description="transformers backend: run the model code a Hugging Face "
        "directory ships (auto_map); off unless set, since that code runs with your rights")
    cache_dir: str | None = Field(
        default=None, description="where on-the-fly imports are cached (default "
        "$ASTRAI_CACHE_DIR, else ~/.cache/astrai)")
    config: dict[str, Any] | None = Field(
        default=None, description="ModelConfig fields for a model trained from scratch"
    )
    tokenizer: str | None = Field(
        default=None, description="tokenizer directory (default: the checkpoint's own files)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    freeze: list[Literal["vision", "projector"]] = Field(
        default_factory=lambda: ["vision"], description="parts of a vision-language model "
        "(transformers backend) that do not train: vision (the image encoder), projector "
        "(image features into the language model); [] trains every part. No effect on a "
        "text-only model")
    lora: LoraSection | None = Field(
        default=None, description="train a LoRA adapter (peft) instead of every weight")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if (self.path is None) == (self.config is None):
            raise ValueError("give exactly one of `path` (a checkpoint) or `config` (from scratch)")
        if self.config is not None and self.tokenizer is None:
            raise ValueError("a from-scratch model needs `tokenizer` (a tokenizer directory)")
        if self.config is not None and self.backend == "transformers":
            raise ValueError("backend: transformers loads a Hugging Face directory from `path`; "
                             "a from-scratch `config` is a native model")
        return self


class RolloutSection(Section):
    """How online strategies draw rollouts (ignored by offline strategies)."""

    max_staleness: int = Field(
        default=0, ge=0, description="optimizer steps a rollout's sampling policy may lag the "
        "policy that trains on it: k >= 1 samples the next rollout while training on this one "
        "(needs an asynchronous sampler, e.g. ray); 0 = on-policy")
    max_logprob_diff: float | None = Field(
        default=None, gt=0, description="stop the run when a step's sampler/trainer log-prob "
        "mismatch (rollout/logprob_diff_max) exceeds this: a weight push that did not reach "
        "the sampler is an error: 1e-4 for the torch sampler, 1e-3 for vllm on CPU in float32 "
        "(docs/rl-objectives.md); null = no check")
    log_samples: int = Field(
        default=0, ge=0, description="every that many training rollouts (and the first), log "
        "log_samples_count of their samples: the prompt exactly as the model saw it, the "
        "completion and its reward, to the run log and to trackers that take text or tables "
        "(wandb, tensorboard, mlflow, trackio); 0 = never")
    log_samples_count: int = Field(
        default=2, ge=1, description="samples logged each time (log_samples)")
    partial: bool = Field(
        default=False, description="interruptible rollouts: each rollout step decodes at "
        "most partial_tokens tokens per sequence, trains on the groups that finished and "
        "carries the others to the next step, continued under the new weights; needs "
        "max_staleness >= 1 and strategy.rollout_correction (docs/throughput.md)")
    partial_tokens: int = Field(
        default=64, ge=1, description="with partial: true, the tokens each sequence decodes "
        "per segment; a rollout step runs segments until enough groups have finished")
    partial_overlap: bool = Field(
        default=True, description="with partial: true and an asynchronous sampler (ray): the "
        "workers keep decoding while the trainer steps, and each weight push interrupts them "
        "between two decode steps (not bit-reproducible); false: segments run only while "
        "the trainer waits, reproducibly. No effect with a sampler in the trainer's process")


class RunConfig(Section):
    """A whole `astrai train` config."""

    output_dir: str
    model: ModelSection
    data: DataConfig
    strategy: ComponentSection
    advantage: ComponentSection | None = None
    rewards: list[RewardSection] = Field(default_factory=list)
    sampler: ComponentSection | None = None
    device: ComponentSection = Field(default_factory=lambda: ComponentSection(name="auto"))
    trainer: TrainerConfig
    rollout: RolloutSection = Field(default_factory=RolloutSection, description=(
        "how online strategies draw rollouts: max_staleness (overlap of sampling and "
        "training), max_logprob_diff (checked weight pushes), partial (interruptible rollouts); validated as the `rollout` table below"))
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig, description="the data-parallel mesh of a distributed "
        "run (torchrun): FSDP2 sharding, replication, activation checkpointing")
    environment: ComponentSection | None = Field(
        default=None, description="multi-turn rollouts and evaluation: an environment "
        "(default single_turn) with its options and the episode keys max_turns, max_tokens, "
        "step_timeout, stop_at_tool_call")
