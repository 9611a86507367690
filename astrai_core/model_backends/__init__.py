"""Model backends other than the native decoder.

:mod:`~astrai_core.model_backends.transformers_lm` wraps any transformers
``AutoModelForCausalLM`` to the native model's interface (``forward`` with ``target_ids``,
hidden states, KV-cached generation, activation checkpointing), so the trainer,
strategies, samplers, LoRA and FSDP2 use it as they use :class:`astrai_core.model.CausalLM`.
Loading and saving it as Hugging Face directories is :mod:`astrai_core.checkpoints.hf_model`.

Nothing is imported here: importing a submodule imports torch (and transformers, lazily).
"""
