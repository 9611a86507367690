"""astrai-core's own components, registered through the same hooks as any plugin."""

from __future__ import annotations

from astrai_core.plugins.hookspecs import hookimpl
from astrai_core.plugins.specs import (
    DeviceBackendSpec,
    EnvironmentSpec,
    ModelImporterSpec,
    PolicyLossSpec,
    RewardFunctionSpec,
    SamplerSpec,
    StrategySpec,
    TrackerSpec,
)


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(name="seq", target="astrai_core.strategies.language_modeling:Seq",
                     summary="pretraining: next-token loss on raw text (packed)"),
        StrategySpec(name="sft", target="astrai_core.strategies.language_modeling:Sft",
                     summary="supervised fine-tuning: next-token loss on assistant turns"),
    ]


@hookimpl
def astrai_device_backends() -> list[DeviceBackendSpec]:
    return [
        DeviceBackendSpec(name="cpu", target="astrai_core.devices.cpu:CpuBackend",
                          summary="CPU; distributed runs over gloo", priority=0),
        DeviceBackendSpec(name="cuda", target="astrai_core.devices.cuda:CudaBackend",
                          summary="NVIDIA GPUs; distributed runs over NCCL",
                          available="astrai_core.devices.cuda:cuda_available", priority=100),
    ]


@hookimpl
def astrai_model_importers() -> list[ModelImporterSpec]:
    return [
        ModelImporterSpec(name="llama", target="astrai_core.checkpoints.hf.llama:LlamaImporter",
                          summary="Llama, Mistral and Qwen2 Hugging Face checkpoints",
                          model_types=("llama", "mistral", "qwen2")),
    ]


@hookimpl
def astrai_samplers() -> list[SamplerSpec]:
    return [
        SamplerSpec(name="torch", target="astrai_core.sampling.torch_sampler:TorchSampler",
                    summary="batched KV-cached sampling with the live native model",
                    reports_routing=True),
    ]


@hookimpl
def astrai_reward_functions() -> list[RewardFunctionSpec]:
    return [
        RewardFunctionSpec(name="exact_match", target="astrai_core.rewards.builtin:exact_match",
                           summary="1 when the completion's final number equals the `answer` column"),
        RewardFunctionSpec(name="format_regex", target="astrai_core.rewards.builtin:FormatRegex",
                           summary="1 when the completion matches `pattern` (search or fullmatch)"),
        RewardFunctionSpec(name="length_penalty", target="astrai_core.rewards.builtin:LengthPenalty",
                           summary="-coef x (length - target) beyond a target length"),
        RewardFunctionSpec(name="overlong_penalty",
                           target="astrai_core.rewards.builtin:OverlongPenalty",
                           summary="DAPO's soft overlong punishment: a ramp to -1 over the "
                           "last `cache` tokens before `max_length`"),
        RewardFunctionSpec(name="code_tests", target="astrai_core.rewards.code_tests:CodeTests",
                           summary="share of the `tests` column's cases the completion's code "
                           "passes, run in the sandbox"),
        RewardFunctionSpec(name="gsm8k", target="astrai_core.rewards.maths:Gsm8k",
                           summary="1 when the completion's `#### N` answer (or last number) "
                           "equals the answer column's"),
        RewardFunctionSpec(name="math_verify", target="astrai_core.rewards.maths:MathVerify",
                           summary="1 when math-verify finds the answer equivalent (LaTeX, "
                           "\\boxed, fractions; extra: math)"),
    ]


@hookimpl
def astrai_policy_losses() -> list[PolicyLossSpec]:
    module = "astrai_core.rl.policy_losses"
    return [
        PolicyLossSpec(name="ppo_clip", target=f"{module}:PPOClip",
                       summary="PPO-clip with asymmetric eps_low/eps_high (DAPO clip-higher)"),
        PolicyLossSpec(name="dual_clip", target=f"{module}:DualClip",
                       summary="PPO-clip whose loss for negative advantages is capped at -A c"),
        PolicyLossSpec(name="gspo", target=f"{module}:GSPO",
                       summary="GSPO: one clipped ratio per sequence, exp(mean token log-ratio)"),
        PolicyLossSpec(name="cispo", target=f"{module}:CISPO",
                       summary="CISPO: clipped stop-gradient IS weight times the log-prob"),
    ]


@hookimpl
def astrai_environments() -> list[EnvironmentSpec]:
    return [
        EnvironmentSpec(name="single_turn", target="astrai_core.environments.base:SingleTurn",
                        summary="one assistant turn scored by the reward functions (the default)"),
        EnvironmentSpec(name="tools", target="astrai_core.environments.tools:Tools",
                        summary="Python functions (module:function) as tools in the OpenAI "
                        "format; multi-turn Hermes tool calls"),
    ]


@hookimpl
def astrai_trackers() -> list[TrackerSpec]:
    module = "astrai_core.trackers"
    return [
        TrackerSpec(name="tensorboard", target=f"{module}.tensorboard:TensorBoard",
                    summary="TensorBoard event files under <output_dir>/tensorboard "
                    "(extra: tensorboard)"),
        TrackerSpec(name="wandb", target=f"{module}.wandb:WandB",
                    summary="a Weights & Biases run, online or offline, continued on resume "
                    "(extra: wandb)"),
        TrackerSpec(name="mlflow", target=f"{module}.mlflow:MLflow",
                    summary="an MLflow run on a tracking server or store, continued on resume "
                    "(extra: mlflow)"),
        TrackerSpec(name="trackio", target=f"{module}.trackio:Trackio",
                    summary="a Trackio run, local or on a Space, continued on resume "
                    "(extra: trackio)"),
    ]
