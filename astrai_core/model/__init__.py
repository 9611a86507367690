"""The native decoder model, its KV cache and checkpoint I/O. Importing this imports torch."""

from astrai_core.model.checkpoint import load_pretrained, load_state_dict_strict, save_pretrained
from astrai_core.model.config import ModelConfig
from astrai_core.model.decoder import CausalLM, enable_activation_checkpointing
from astrai_core.model.kv_cache import KVCache
from astrai_core.model.masks import positions_from_attention_mask

__all__ = ["CausalLM", "KVCache", "ModelConfig", "load_pretrained", "load_state_dict_strict",
           "enable_activation_checkpointing", "positions_from_attention_mask", "save_pretrained"]
