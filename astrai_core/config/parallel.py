"""The `parallel:` section of a run config: the data-parallel mesh (replicated or sharded,
and over how many processes; see docs/distributed.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ParallelConfig(BaseModel):
    """How the processes of a distributed run (torchrun) share the model.

    The ranks form a DeviceMesh of ``dp_replicate x dp_shard``: parameters, gradients and
    optimizer state are sharded (FSDP2) over ``dp_shard`` and replicated over
    ``dp_replicate`` (HSDP when both are > 1). A one-process run ignores the section.
    """

    model_config = ConfigDict(extra="forbid")

    dp_shard: int = Field(-1, ge=-1, description="ranks each parameter is sharded over; -1: "
                          "every rank not used by replication (world size / dp_replicate)")
    dp_replicate: int = Field(1, ge=1, description="replicas of the sharded model (HSDP when "
                              "> 1 together with dp_shard > 1)")
    context_parallel: int = Field(
        1, ge=1, description="ranks that split each row's tokens (Ulysses attention: an "
        "all-to-all trades the token shard for a head shard around attention); the "
        "processes form data-parallel groups of this many consecutive ranks; seq and sft, "
        "on the native model or, on the transformers backend, llama, mistral, qwen2, qwen3 "
        "and gemma3_text")
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward "
        "instead of keeping them (less memory, ~1/3 more compute)")
    timeout_seconds: float = Field(
        600.0, gt=0, description="process-group timeout: a collective that waits longer "
        "(a rank died or hangs) fails the job instead of hanging")

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        if self.dp_shard == 0:
            raise ValueError("dp_shard must be -1 (the rest of the ranks) or >= 1")
        return self
