"""``rollout.log_samples``: a few rendered samples of the training rollouts, so that a
prompt-template mistake shows in the run log and the trackers at the first rollout."""

from __future__ import annotations

from typing import Any

from astrai_core.rollout.batch import RolloutBatch


def rendered_samples(rollout: RolloutBatch, tokenizer: Any, count: int) -> list[dict[str, Any]]:
    """The first ``count`` sequences: the prompt's tokens decoded with the special ones (what
    the model saw), the completion's text and its total reward."""
    out = []
    for row in range(min(count, len(rollout.completions))):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        out.append({"prompt": tokenizer.decode(prompt, skip_special_tokens=False),
                    "completion": rollout.completions[row],
                    "reward": float(rollout.rewards[row])})
    return out


class RolloutSampleLog:
    """Offered every training rollout; writes samples of the first and of every
    ``every``-th to ``report`` (the run's report, set by rank 0's trainer; None: nothing)."""

    def __init__(self, every: int, count: int, tokenizer: Any) -> None:
        self.every, self.count, self.tokenizer = every, count, tokenizer
        self.report: Any = None

    def offer(self, number: int, rollout: RolloutBatch) -> RolloutBatch:
        """``rollout``, the ``number``-th drawn (from 1), after logging its samples if due."""
        if self.report is not None and (number == 1 or number % self.every == 0):
            self.report.write_samples(number, rendered_samples(rollout, self.tokenizer,
                                                               self.count))
        return rollout
