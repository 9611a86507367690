"""The built-in ``llama`` importer: Llama, Mistral and Qwen2 (dense) checkpoints.

They differ only in their config: Mistral adds a sliding window, Qwen2 has biases on
q/k/v (never on o) and Qwen's sliding-window spelling. Llama's ``attention_bias`` also
puts a bias on ``o_proj`` and ``mlp_bias`` on the MLP, which the native decoder does not
have, so those checkpoints are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astrai_core.checkpoints.hf.base import HFImporter
from astrai_core.checkpoints.hf.config import (
    common_fields_from_hf,
    common_fields_to_hf,
    qwen_sliding_window,
    qwen_sliding_window_to_hf,
)
from astrai_core.errors import CheckpointError

if TYPE_CHECKING:
    from astrai_core.model import ModelConfig

# Defaults of the transformers config classes, for keys a config.json may omit.
_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}
_MISTRAL_DEFAULT_WINDOW = 4096


class LlamaImporter(HFImporter):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2")
    architectures = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                     "qwen2": "Qwen2ForCausalLM"}

    def fields_from_hf(self, hf_config: dict[str, Any], model_type: str) -> dict[str, Any]:
        fields = common_fields_from_hf(hf_config, max_position_default=_MAX_POSITIONS[model_type])
        if model_type == "llama":
            for flag in ("attention_bias", "mlp_bias"):
                if hf_config.get(flag):
                    raise CheckpointError(f"config.json has {flag}=true: Llama then has biases on "
                                          "o_proj/MLP, which the native decoder does not support")
        elif model_type == "mistral":
            fields["sliding_window"] = hf_config.get("sliding_window", _MISTRAL_DEFAULT_WINDOW)
        else:  # qwen2: q/k/v always carry a bias
            fields["attention_bias"] = True
            fields["sliding_window"] = qwen_sliding_window(hf_config)
        return fields

    def fields_to_hf(self, cfg: ModelConfig, model_type: str) -> dict[str, Any]:
        hf = common_fields_to_hf(cfg, model_type, self.architectures[model_type])
        if model_type == "llama":
            hf.update(attention_bias=False, mlp_bias=False)
        elif model_type == "mistral":
            hf["sliding_window"] = cfg.sliding_window
        else:
            hf.update(qwen_sliding_window_to_hf(cfg.sliding_window, cfg.num_layers))
        return hf
