"""Which distribution of this repository provides which component name.

Used only for error messages: when a name is unknown, astrai can say which
``pip install`` would provide it.
"""

from __future__ import annotations

SHIPPED: dict[tuple[str, str], str] = {
    ("strategy", "grpo"): "astrai-plugin-grpo",
    ("strategy", "ppo"): "astrai-plugin-ppo",
    ("strategy", "dpo"): "astrai-plugin-dpo",
    ("strategy", "kto"): "astrai-plugin-dpo",
    ("strategy", "orpo"): "astrai-plugin-dpo",
    ("strategy", "rm"): "astrai-plugin-rm",
    ("reward_function", "reward_model"): "astrai-plugin-rm",
    ("reward_function", "judge"): "astrai-plugin-rm",
    ("strategy", "distill"): "astrai-plugin-distill",
    ("advantage_estimator", "grpo"): "astrai-plugin-grpo",
    ("advantage_estimator", "reinforce_pp"): "astrai-plugin-grpo",
    ("advantage_estimator", "gae"): "astrai-plugin-gae",
    ("advantage_estimator", "rloo"): "astrai-contrib-rloo",
    ("sampler", "vllm"): "astrai-plugin-vllm",
    ("sampler", "ray"): "astrai-plugin-ray",
    ("model_importer", "qwen3"): "astrai-plugin-qwen3",
    ("device_backend", "npu"): "astrai-plugin-npu",
    ("environment", "verifiers"): "astrai-plugin-verifiers",
}

# Hugging Face model_type -> distribution whose importer handles it.
MODEL_TYPES: dict[str, str] = {
    "llama": "astrai-core",
    "mistral": "astrai-core",
    "qwen2": "astrai-core",
    "qwen3": "astrai-plugin-qwen3",
    "qwen3_moe": "astrai-plugin-qwen3",
    "qwen2_moe": "astrai-plugin-qwen3",
}
