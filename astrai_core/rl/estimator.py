"""The base of advantage estimators: options validated once, the call reduced to the maths.

An estimator is a class built with its ``advantage:`` options as keyword arguments and
called with keyword tensors (the interface in docs/plugins.md). A subclass of
:class:`AdvantageEstimator` declares its options as a pydantic ``Config`` (the run plan
validates the section against it, so a bad option is one config error naming the field),
``needs_values`` when it wants a critic's values, and implements :meth:`estimate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from torch import Tensor


class AdvantageEstimator:
    """``Estimator(**options)(token_rewards=, response_mask=, group_ids=, values=None)``
    -> ``(advantages, returns)``; subclasses implement :meth:`estimate`."""

    needs_values: ClassVar[bool] = False  # True when it needs a critic's values (GAE)

    class Config(BaseModel):
        """No options; a subclass with options declares its own (``extra="forbid"``)."""

        model_config = ConfigDict(extra="forbid")

    def __init__(self, **params: object) -> None:
        self.config = self.Config(**params)

    def __call__(self, *, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return self.estimate(token_rewards, response_mask, group_ids, values)

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(advantages [N, T], returns [N, T] or None) of a rollout: ``token_rewards``
        [N, T] float, ``response_mask`` [N, T] bool, ``group_ids`` [N] (same id = same
        prompt), ``values`` [N, T] (V(s_t)) or None."""
        raise NotImplementedError
