"""The plain types between the Tinker HTTP layer and the engine that trains and samples.

Nothing here knows HTTP or the SDK's wire format: the HTTP layer converts the SDK's
requests into these, and the engine's results back. Arrays are numpy, shaped as the SDK's
``TensorData`` (per datum, one entry per input token unless a loss says otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from astrai_core.errors import AstraiError

LossName = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"]
StopReason = Literal["length", "stop"]


class EngineRequestError(AstraiError):
    """A request the engine refuses: the client's mistake, answered with a 4xx and this text."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class BaseModelFacts:
    """What a client may learn of a base model offered by the server."""

    name: str
    tokenizer_path: str  # a local directory AutoTokenizer.from_pretrained can read
    vocab_size: int
    max_context: int
    max_lora_rank: int


@dataclass(frozen=True)
class LoraSpec:
    """A tenant's adapter, as the SDK's ``LoraConfig`` asks for it."""

    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class AdamSpec:
    """One optimizer step's hyperparameters, as the SDK's ``AdamParams`` (decoupled decay)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0: no clipping


@dataclass(frozen=True)
class DatumIn:
    """One training example: the input tokens and the loss's per-token inputs.

    ``loss_fn_inputs`` holds ``target_tokens`` (int64) and ``weights`` (float32) for
    cross_entropy; ``target_tokens``, ``logprobs`` (the sampler's) and ``advantages`` for
    the policy losses; each of the input's length.
    """

    tokens: list[int]
    loss_fn_inputs: dict[str, np.ndarray]


@dataclass
class ForwardOut:
    """Per-datum outputs (``logprobs``, ``elementwise_loss``, …) and summed metrics.

    Metric keys follow the SDK's ``name:reduction`` convention, for example ``loss:sum``.
    """

    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleSpec:
    """Sampling options of one request, as the SDK's ``SamplingParams``."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filter
    seed: int | None = None
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


@dataclass
class SampledOut:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason


@dataclass
class SampleOut:
    sequences: list[SampledOut]
    prompt_logprobs: list[float | None] | None = None  # None at position 0


@dataclass(frozen=True)
class SamplerTarget:
    """What to sample from: a base model, or weights saved for sampling (a state-dir key)."""

    base_model: str
    weights: str | None = None


class Engine(Protocol):
    """Trains tenants' LoRA adapters on shared base models and samples from them.

    Calls are synchronous and may be slow; the HTTP layer queues them (fairly, per tenant)
    and runs one at a time. Every method raises :class:`EngineRequestError` for a request
    that cannot be served (unknown model, rank too large, token out of range, shapes that
    do not match); the engine stays usable afterwards.
    """

    def base_models(self) -> list[BaseModelFacts]: ...

    def create_model(self, model_id: str, base_model: str, lora: LoraSpec) -> None: ...

    def unload_model(self, model_id: str) -> None: ...

    def model_base(self, model_id: str) -> BaseModelFacts: ...

    def forward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                loss_fn_config: dict[str, float] | None = None) -> ForwardOut: ...

    def forward_backward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                         loss_fn_config: dict[str, float] | None = None) -> ForwardOut:
        """Like :meth:`forward`, and adds the loss's gradients to the adapter's."""
        ...

    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        """Apply and clear the accumulated gradients; returns metrics (``grad_norm:mean``, …)."""
        ...

    def save_weights(self, model_id: str, name: str, *, for_sampler: bool) -> str:
        """Write the adapter (and unless ``for_sampler``, the optimizer state) under the
        state dir; returns its key, ``<model_id>/<weights|sampler_weights>/<name>``."""
        ...

    def load_weights(self, model_id: str, key: str, *, with_optimizer: bool) -> None: ...

    def sample(self, target: SamplerTarget, prompt: list[int], num_samples: int,
               spec: SampleSpec, *, prompt_logprobs: bool = False) -> SampleOut: ...
