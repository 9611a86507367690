"""astrai-plugin-rm: hook implementations (light; the targets live in submodules).

- strategy ``rm``: a Bradley-Terry reward model trained on ``preference`` data;
- reward functions ``reward_model`` (a trained reward model scores each completion) and
  ``judge`` (an LLM judge behind any OpenAI-compatible endpoint);
- ``python -m astrai_plugin_rm export|import SRC DST``: reward-model checkpoints to and from
  Hugging Face ``AutoModelForSequenceClassification`` directories; the spec names the
  exporter, so ``astrai export`` of an rm checkpoint writes the same directory.
"""

from __future__ import annotations

from astrai_core import RewardFunctionSpec, StrategySpec, hookimpl


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="rm",
            target="astrai_plugin_rm.strategy:RewardModeling",
            summary="Bradley-Terry reward model (the model + a scalar score head) on preference "
                    "pairs; optional margin and reward centring",
            # its checkpoints are sequence classifiers: `astrai export` writes them so
            exporter="astrai_plugin_rm.hf:export_reward_model",
        )
    ]


@hookimpl
def astrai_reward_functions() -> list[RewardFunctionSpec]:
    return [
        RewardFunctionSpec(
            name="reward_model",
            target="astrai_plugin_rm.reward_model:RewardModelReward",
            summary="the score of a trained reward model (rm strategy or imported HF classifier)",
        ),
        RewardFunctionSpec(
            name="judge",
            target="astrai_plugin_rm.judge:Judge",
            summary="an LLM judge over an OpenAI-compatible endpoint: prompt template + score "
                    "parser",
        ),
    ]
