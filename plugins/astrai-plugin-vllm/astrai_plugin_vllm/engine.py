"""Starting a vLLM engine on an astrai policy.

A native policy is exported to a Hugging Face directory with its importer's
``export_checkpoint`` (the same code as ``astrai export``), a transformers-backend policy
written as the Hugging Face directory it is. ``vllm.LLM`` loads that directory with an explicit dtype: left to ``auto``, vLLM downcasts float32 checkpoints
to bfloat16 without a word, and the sampler's log-probs would no longer match the
trainer's. vLLM is imported here, never by the plugin's hook module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from astrai_core.api import get_logger, scoped_env

log = get_logger(__name__)

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def export_policy(model: torch.nn.Module, native_dir: Path | None, work_dir: Path,
                  model_type: str | None = None) -> Path:
    """A Hugging Face directory holding ``model`` (written under ``work_dir``).

    ``native_dir`` is the native checkpoint the model was loaded from, if any: its export
    keeps the original ``config.json``. A live model is first saved as a native checkpoint.
    A transformers-backend policy is written as its own Hugging Face directory (its
    family's names and config; ``model_type`` does not apply).
    """
    from astrai_core.api import export_model_type, load_importer
    from astrai_core.api import hf_name_prefix, save_hf_directory
    from astrai_core.api import save_pretrained
    from astrai_core.api import process_registry

    if hf_name_prefix(model) is not None:
        return save_hf_directory(model, work_dir / "hf")
    if native_dir is None:
        native_dir = save_pretrained(model, work_dir / "native")
    model_type = model_type or export_model_type(native_dir)
    importer = load_importer(process_registry(), model_type=model_type)
    return importer.export_checkpoint(native_dir, work_dir / "hf", model_type=model_type)


def policy_dtype(model: torch.nn.Module) -> str:
    """vLLM's name for the dtype of the policy's floating-point weights."""
    from astrai_core.api import merged_state_dict

    # a LoRA policy: the dtype of the merged weights (its float32 adapter is merged away)
    dtypes = {t.dtype for t in merged_state_dict(model).values() if t.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(f"the policy mixes weight dtypes {sorted(map(str, dtypes))}; pass the "
                         "sampler's `dtype` option explicitly")
    dtype = dtypes.pop()
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"vLLM cannot run weights of dtype {dtype}")
    return DTYPE_NAMES[dtype]


def start_engine(hf_dir: Path, *, dtype: str, multiprocess: bool, cpu_kv_cache_gib: int | None,
                 engine_args: dict[str, Any], tokenizer: bool = False) -> Any:
    """A ``vllm.LLM`` over ``hf_dir`` that takes token ids and reports processed log-probs.

    ``multiprocess=False`` keeps the engine core in this process (it starts in seconds
    and takes weights as tensors); otherwise vLLM runs it in its own process.
    ``tokenizer``: load the directory's tokenizer and processor (a vision-language
    model's processing refuses to start without them; prompts are still token ids).
    """
    import vllm.envs

    settings = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0"}
    if cpu_kv_cache_gib is not None:
        settings["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib)
    # vLLM caches its environment after the first engine starts; a second engine in
    # this process must see the settings chosen for it.
    getattr(vllm.envs, "disable_envs_cache", lambda: None)()
    with scoped_env(settings):
        from vllm import LLM

        log.info("starting vLLM", model=str(hf_dir), dtype=dtype, multiprocess=multiprocess,
                 **{k: v for k, v in engine_args.items() if v is not None})
        return LLM(model=str(hf_dir), dtype=dtype,
                   skip_tokenizer_init=not tokenizer,  # token ids in, token ids out
                   logprobs_mode="processed_logprobs",  # temperature-scaled (see sampler.py)
                   generation_config="vllm",          # no sampling defaults from the checkpoint
                   **{k: v for k, v in engine_args.items() if v is not None})


def sleep_args(sleep: bool) -> dict[str, Any]:
    """The engine arguments of ``sampler.sleep``; an error where vLLM has no sleep mode
    (its CPU backend, for one: there the engine's memory is the trainer's host memory)."""
    if not sleep:
        return {}
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        from astrai_core.api import ConfigError

        raise ConfigError(f"sampler.sleep: vLLM has no sleep mode on this platform "
                          f"({current_platform.device_type}); leave sleep off")
    return {"enable_sleep_mode": True}
