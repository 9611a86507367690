"""What a strategy needs from a run, declared before anything is built (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ComponentChoice:
    """A component a strategy asks the run to build: kind, name, options, and the config
    path that chose it (for error messages)."""

    kind: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    path: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class StrategyNeeds:
    """A strategy's answer to "what must this run provide?", for its validated options.

    The run plan checks the config against it before the tokenizer or the model is
    loaded, and the wiring builds exactly what it lists.
    """

    data_formats: tuple[str, ...]      # training-data formats it reads (``data.sources``)
    rollouts: bool = False             # samples from the policy: needs a sampler and rewards
    advantage: bool = False            # runs an advantage estimator (``advantage:``)
    values: bool = False               # trains a critic, so estimators may ask for values
    group_size: int = 1                # completions per prompt of each rollout
    policy_loss: ComponentChoice | None = None  # the policy loss its objective composes
    sampler_routing: bool = False      # replays the sampler's MoE routing (router_replay: R3)
    generates: bool = False            # samples from the policy without rewards: a sampler
    # Why each row must hold one example (e.g. "samples a reply to each row's prompt");
    # None: packed rows are fine. The plan then unpacks rows unless data.pack is set true.
    unpacked_rows: str | None = None
    # Runs under parallel.context_parallel: each rank of a context group computes its
    # shard of every row's tokens, and every rank gets the whole rows' log-probs
    context_parallel: bool = False
    # ... and its loss is each rank's token shard's, weighted by the shard's targets (seq,
    # sft); otherwise every rank of a context group computes the whole rows' loss alike
    # and the trainer counts the group once
    loss_on_token_shards: bool = False
