"""The test kit for strategy and plugin authors.

- tiny arithmetic runs built in-process exactly as ``astrai train`` builds them, and the
  CLI in a subprocess (:mod:`astrai_core.testing.runs`, re-exported here);
- independent float64 references for rollout log-probs (:mod:`astrai_core.testing.logprobs`)
  and for a short online run's steps (:mod:`astrai_core.testing.policy_gradient`);
- runs killed by SIGKILL at a named phase, for tests of exact resume
  (``python -m astrai_core.testing.faults``);
- tiny servable checkpoints and a live server (:mod:`astrai_core.testing.serving`);
- what a run's processes listen on, from the kernel's socket table
  (:mod:`astrai_core.testing.net`, Linux);
- tiny Hugging Face models to prove an importer against transformers
  (:mod:`astrai_core.testing.parity`, imports torch and transformers);
- tiny vision-language model directories with their processors, built offline
  (:mod:`astrai_core.testing.hf_vlms`: Gemma 3, LLaVA, Idefics3, SmolVLM,
  Qwen2.5-VL, Qwen3-VL), and preference rows with images for them
  (:mod:`astrai_core.testing.vlm_rows`).

Importing this package is cheap: torch and the training engine load inside the functions.
"""

from astrai_core.testing.logprobs import reference_log_softmax, reference_token_logprobs
from astrai_core.testing.policy_gradient import (fit_recording_rollouts, group_advantages,
                                                 grpo_step_references, token_mean_objective)
from astrai_core.testing.runs import (ARITH_EOS, ARITH_TOKENIZER, CLI_PROBE, DIGIT_REWARD,
                                      REPO_ROOT, TINY_MODEL, build_strategy, read_metrics,
                                      run_astrai, tiny_run_config, write_arith_prompts)

__all__ = ["ARITH_EOS", "ARITH_TOKENIZER", "CLI_PROBE", "DIGIT_REWARD", "REPO_ROOT", "TINY_MODEL",
           "build_strategy", "fit_recording_rollouts", "group_advantages",
           "grpo_step_references", "read_metrics", "reference_log_softmax",
           "reference_token_logprobs", "run_astrai", "tiny_run_config", "token_mean_objective",
           "write_arith_prompts"]
