"""The online (RL) loop: one optimizer step on rollouts, from the draw to the loss.

In the order a step runs (docs/rl-loop.md walks it): :mod:`.source` (the schedule: draw,
process once, cut into steps), :mod:`.prepare` (a drawn rollout made trainable: old and
reference log-probs, values, advantages), :mod:`.mismatch` (the sampler/trainer mismatch
and the rollout-correction weights, measured one way), :mod:`.deferred` (the same from
the training forward, when the no-grad one is skipped), :mod:`.routing` (MoE router
replay), :mod:`.strategy` (the :class:`OnlineStrategy` base around them). The options and
their rules are :mod:`astrai_core.config.online`.
"""
