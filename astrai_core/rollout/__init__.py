"""Online rollouts: the batch record, the trainer-side forward, the runner and evaluation."""

from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.evaluate import evaluate_generation
from astrai_core.rollout.forward import policy_forward
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.rollout.records import PromptRecord, as_prompt_record
from astrai_core.rollout.runner import RolloutRunner

__all__ = ["PromptRecord", "RolloutBatch", "RolloutRunner", "as_prompt_record", "evaluate_generation",
           "policy_forward", "rollout_metrics"]
