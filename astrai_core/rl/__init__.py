"""Tensor math shared by astrai's RL algorithms and by any RL plugin.

Plugins must not import each other, so the pieces several algorithms need (masked
statistics, token log-probs, KL estimators, the clipped policy loss, loss
aggregation, group statistics) live here, in :mod:`astrai_core.rl.functional`.
Importing this package does not import torch; importing ``functional`` does.
"""
