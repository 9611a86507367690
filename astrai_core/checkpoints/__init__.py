"""Everything that reads or writes weights on disk, in one place.

- :mod:`~astrai_core.checkpoints.native`: native checkpoint directories (config.json,
  safetensors, tokenizer files): ``save_pretrained``, ``load_pretrained``;
- :mod:`~astrai_core.checkpoints.lora_files`: LoRA adapters as PEFT-format files;
- :mod:`~astrai_core.checkpoints.hf`: Hugging Face import/export (the ``model_importer`` kind);
- :mod:`~astrai_core.checkpoints.training_state`: a run's ``step_<N>`` checkpoints (model,
  optimizer, RNG, data position) for an exact resume;
- :mod:`~astrai_core.checkpoints.sharded`: the torch.distributed.checkpoint side of those
  (FSDP2-sharded modules and optimizers).

Nothing is imported here, so importing a torch-free submodule stays torch-free.
"""
