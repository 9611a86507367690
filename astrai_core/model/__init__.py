"""The native decoder model and its KV cache: pure torch. Importing this imports torch.

Reading and writing it on disk is :mod:`astrai_core.checkpoints`.
"""

from astrai_core.model.config import ModelConfig
from astrai_core.model.decoder import CausalLM, enable_activation_checkpointing
from astrai_core.model.kv_cache import KVCache
from astrai_core.model.masks import positions_from_attention_mask

__all__ = ["CausalLM", "KVCache", "ModelConfig", "enable_activation_checkpointing",
           "positions_from_attention_mask"]
