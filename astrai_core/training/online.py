"""The online (RL) strategy base: rollouts in, micro-batches out.

For every rollout the runner draws (prompts x ``group_size`` completions, scored by the
reward functions), :class:`OnlineStrategy`:

1. measures the sampler/trainer log-prob mismatch (``rollout/logprob_diff_*``) with one
   no-grad trainer forward, and keeps those trainer log-probs as ``old_logprobs`` when
   ``recompute_old_logprobs`` is on;
2. lets the subclass attach per-token tensors (:meth:`prepare_rollout`: reference
   log-probs, critic values, ...);
3. builds token rewards (score on the last response token, optional KL shaping) and runs
   the advantage estimator (``advantage:`` section, or the strategy's default);
4. serves ``epochs x mini_batches`` optimizer steps from it, each mini-batch cut into the
   trainer's ``grad_accum_steps`` micro-batches; then the next rollout is drawn with the
   weights published at that optimizer-step boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from astrai_core.errors import ConfigError
from astrai_core.rl.functional import token_rewards_from_scores
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.training.strategy import Strategy


class OnlineConfig(BaseModel):
    """Options every online strategy shares (subclass configs extend this)."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(8, ge=1, description="completions sampled per prompt")
    epochs: int = Field(1, ge=1, description="passes over each rollout")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass over a rollout")
    recompute_old_logprobs: bool = Field(
        False, description="use the trainer's log-probs of the rollout as the old policy "
        "instead of the sampler's (they agree with the torch sampler)")
    kl_in_reward_coef: float = Field(0.0, ge=0, description="KL-to-reference shaping of "
                                     "the token rewards (needs a reference model)")
    kl_estimator: str = Field("k1", pattern="^k[123]$")


class OnlineStrategy(Strategy):
    """Base of strategies trained on rollouts (grpo, ppo, online dpo)."""

    Config: ClassVar[type[BaseModel]] = OnlineConfig
    online: ClassVar[bool] = True
    default_advantage: ClassVar[str | None] = None

    def setup(self) -> None:
        self.estimator = self.ctx.advantage_estimator(self.default_advantage)
        self.runner = self.ctx.rollout_runner(
            group_size=self.config.group_size,
            steps_per_rollout=self.config.epochs * self.config.mini_batches)
        self.rollout_stats: dict[str, float] = {}
        self._step_in_rollout = 0

    # -- per-rollout work -------------------------------------------------------------
    def prepare_rollout(self, rollout: RolloutBatch) -> None:
        """Attach per-token tensors to ``rollout.extras`` before advantages are computed."""

    def token_rewards(self, rollout: RolloutBatch) -> torch.Tensor:
        """Scalar reward on each last response token, minus optional KL shaping."""
        ref = rollout.extras.get("ref_logprobs") if self.config.kl_in_reward_coef else None
        if self.config.kl_in_reward_coef and ref is None:
            raise ConfigError("strategy.kl_in_reward_coef needs a reference model")
        return token_rewards_from_scores(
            rollout.rewards, rollout.response_mask, logp_old=rollout.old_logprobs,
            logp_ref=ref, kl_coef=self.config.kl_in_reward_coef,
            kl_kind=self.config.kl_estimator)

    def _new_rollout(self, rollout: RolloutBatch) -> RolloutBatch:
        from astrai_core.rollout.forward import policy_forward

        # Missing with recompute_old_logprobs on: the trainer's forward below provides them.
        missing = self._check_behaviour_logprobs(rollout)
        rollout = rollout.to(self.ctx.device)
        temperature = self.runner.logprob_temperature
        with torch.no_grad():
            self.ctx.model.eval()
            trainer_logprobs = policy_forward(self.ctx.model, rollout, temperature)["logprobs"]
            self.ctx.model.train()
        mask = rollout.response_mask
        stats = rollout_metrics(rollout)
        if not missing:
            diff = (trainer_logprobs - rollout.old_logprobs).abs()[mask]
            stats["rollout/logprob_diff_max"] = diff.max().item() if diff.numel() else 0.0
            stats["rollout/logprob_diff_mean"] = diff.mean().item() if diff.numel() else 0.0
        if self.config.recompute_old_logprobs:
            rollout.old_logprobs = torch.where(mask, trainer_logprobs, 0.0)
        with torch.no_grad():
            self.prepare_rollout(rollout)
            values = rollout.extras.get("values")
            token_rewards = self.token_rewards(rollout)
            advantages, returns = self.estimator(
                token_rewards=token_rewards, response_mask=mask,
                group_ids=rollout.group_ids, values=values)
        rollout.extras["advantages"] = advantages
        if returns is not None:
            rollout.extras["returns"] = returns
        valid = advantages[mask]
        stats["rollout/advantage_mean"] = valid.mean().item() if valid.numel() else 0.0
        stats["rollout/advantage_std"] = valid.std().item() if valid.numel() > 1 else 0.0
        self.rollout_stats = stats
        return rollout

    def _check_behaviour_logprobs(self, rollout: RolloutBatch) -> bool:
        """True when the rollout lacks behaviour log-probs and the trainer may supply them."""
        old = rollout.old_logprobs
        if old is not None and tuple(old.shape) == tuple(rollout.response_ids.shape):
            return False
        if not self.config.recompute_old_logprobs:
            section = self.ctx.run_config.sampler
            sampler = section.name if section is not None else "torch"
            raise ConfigError(
                f"the rollout carries no behaviour log-probs (sampler {sampler!r} returned "
                "none for its tokens), so the old policy is unknown; set "
                "strategy.recompute_old_logprobs: true to compute them with the trainer's model")
        return True

    # -- batches ----------------------------------------------------------------------
    def train_batches(self) -> Iterator[RolloutBatch]:
        accum = self.ctx.trainer_config.grad_accum_steps
        drawn = rollout = None
        order: list[torch.Tensor] = []
        while True:
            # The runner serves one rollout for `epochs x mini_batches` optimizer steps.
            served = self.runner.next_rollout()
            if served is not drawn:
                drawn, rollout = served, self._new_rollout(served)
                order = self._mini_batch_order(len(rollout))
            mini = rollout.select(order.pop(0))
            size = -(-len(mini) // accum)  # ceil: at most `accum` micro-batches per step
            micro_batches = mini.split(size)
            if len(micro_batches) != accum:
                raise ConfigError(
                    f"a mini-batch of {len(mini)} samples cannot be cut into "
                    f"trainer.grad_accum_steps={accum} micro-batches; use fewer")
            yield from micro_batches

    def _mini_batch_order(self, count: int) -> list[torch.Tensor]:
        """Row indices of each optimizer step: a fresh shuffle per epoch, cut in parts."""
        seed = self.ctx.trainer_config.seed * 1_000_003 + self.runner.rollouts_drawn
        generator = torch.Generator().manual_seed(seed)
        steps = []
        for _ in range(self.config.epochs):
            permutation = torch.randperm(count, generator=generator)
            steps += list(permutation.chunk(self.config.mini_batches))
        return steps

    def after_optimizer_step(self, step: int) -> None:
        self.runner.publish_from(self.ctx.model)

    def step_metrics(self) -> dict[str, float]:
        """Rollout statistics to log with every optimizer step."""
        return dict(self.rollout_stats)

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # rollouts_drawn also seeds the mini-batch order of the next rollout.
        return {"rollout": self.runner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runner.load_state_dict(state.get("rollout", {}))
