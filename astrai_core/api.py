"""The public API for plugins: everything a plugin's targets may import from the core.

Plugins import from here (and ``hookimpl`` plus the ``*Spec`` records from ``astrai_core``)
and from nowhere else in the core; a test holds every plugin in this repository to it.
These names keep their meaning across minor releases; everything else in the core may
move. Importing this module imports torch, so hookimpl modules must not import it at
module level: targets do (see docs/plugins.md).
"""

from astrai_core.checkpoints.hf.base import FUSED, PER_EXPERT, HFImporter, dense_mlp_map
from astrai_core.checkpoints.hf.config import (
    common_fields_from_hf,
    common_fields_to_hf,
    qwen_sliding_window,
    qwen_sliding_window_to_hf,
    require,
)
from astrai_core.checkpoints.hf.files import read_hf_config, read_hf_weights, staged_directory
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.checkpoints.hf.select import export_model_type, load_importer
from astrai_core.checkpoints.hf.tensor_map import TensorMap, rename, split_gate_up, stack_experts
from astrai_core.checkpoints.native import load_pretrained, load_state_dict_strict, save_pretrained
from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.config.trainer import TrainerConfig
from astrai_core.devices.accelerator import AcceleratorBackend
from astrai_core.devices.base import DeviceBackend
from astrai_core.devices.select import resolve_device
from astrai_core.data.render import render_preference
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.checkpoints.hf_model import save_hf_directory
from astrai_core.checkpoints.hf_push import hf_name_prefix, iter_hf_push_buckets
from astrai_core.distributed.fsdp import unsharded
from astrai_core.distributed.weight_gather import Deferred, iter_full_buckets, iter_push_buckets
from astrai_core.model_backends.transformers_lm import shipped_code_modules
from astrai_core.environments import AssistantTurn, EnvMessage, EnvStep, ToolCall, error_message
from astrai_core.errors import (
    AstraiError,
    CheckpointError,
    ConfigError,
    DataError,
    FieldError,
    PluginError,
)
from astrai_core.log import get_logger
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.head import (
    chunked_logits_map,
    chunked_logprobs,
    has_chunked_head,
    target_logprobs,
)
from astrai_core.model.lora import has_lora, merge_and_unload, merged_state_dict
from astrai_core.plugins import process_registry
from astrai_core.plugins.sampler_capabilities import (NO_CAPABILITIES, SamplerCapabilities,
                                                      sampler_capabilities)
from astrai_core.plugins.protocols import (
    AdvantageEstimatorProtocol,
    EnvironmentProtocol,
    PolicyLossProtocol,
    RewardFunctionProtocol,
    SamplerProtocol,
    StrategyProtocol,
    TrackerProtocol,
)
from astrai_core.rl.functional import (
    aggregate_loss,
    broadcast_to_tokens,
    clipped_policy_loss,
    entropy_from_logits,
    explained_variance,
    group_stats,
    kl_estimate,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    sequence_scores,
    token_logprobs,
    token_rewards_from_scores,
)
from astrai_core.rl.estimator import AdvantageEstimator
from astrai_core.rl.objective import ObjectiveSettings, PolicyObjective
from astrai_core.rl.policy_losses import apply_rollout_weights
from astrai_core.rl.rollout_correction import RolloutCorrectionConfig, correction_weights
from astrai_core.rollout.batch import RolloutBatch, episode_tensors, pad_rows
from astrai_core.rollout.env_render import MessageRenderer
from astrai_core.rollout.forward import policy_forward, rollout_forward
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.rollout.runner import RolloutRunner
from astrai_core.sampling.params import Completion, SamplingParams
from astrai_core.sampling.requests import Request, expand_requests
from astrai_core.serving.hermes import END_TAG, parse_hermes
from astrai_core.serving.prompts import chat_prompt
from astrai_core.serving.protocol import ChatCompletionRequest
from astrai_core.serving.sampler_engine import SamplerEngine
from astrai_core.serving.sequence import EngineRequest, FinishEvent
from astrai_core.trackers.base import TrackedRun, Tracker, TrackerOptions
from astrai_core.training.batch_sources import BatchSource, LoaderSource, RolloutSource
from astrai_core.training.modules import TrainedModule, frozen_copy, frozen_reference
from astrai_core.training.online import OnlineConfig, OnlineStrategy
from astrai_core.training.run_components import RunComponents
from astrai_core.training.strategy import EmptyConfig, Strategy

__all__ = [
    # strategies
    "BatchSource", "EmptyConfig", "LoaderSource", "OnlineConfig", "OnlineStrategy",
    "RolloutSource", "RunComponents", "RunConfig", "Strategy", "StrategyNeeds",
    "TrainedModule", "TrainerConfig", "frozen_copy", "frozen_reference",
    # rollouts and the trainer-side forward
    "RolloutBatch", "RolloutRunner", "episode_tensors", "pad_rows", "policy_forward",
    "rollout_forward", "rollout_metrics",
    # RL math
    "AdvantageEstimator", "aggregate_loss", "broadcast_to_tokens", "clipped_policy_loss", "entropy_from_logits",
    "explained_variance", "group_stats", "kl_estimate", "masked_mean", "masked_sum",
    "masked_var", "masked_whiten", "sequence_scores", "token_logprobs",
    "token_rewards_from_scores",
    # RL objectives: the shared objective, policy losses, rollout correction
    "ObjectiveSettings", "PolicyObjective", "RolloutCorrectionConfig", "apply_rollout_weights",
    "correction_weights",
    # environments of multi-turn rollouts
    "AssistantTurn", "EnvMessage", "EnvStep", "EnvironmentProtocol", "MessageRenderer", "ToolCall",
    "error_message",
    # the serving engine in process: chat prompts, engine requests and events, tool calls
    "ChatCompletionRequest", "END_TAG", "EngineRequest", "FinishEvent", "SamplerEngine",
    "chat_prompt", "parse_hermes",
    # tokenizers and data rendering (how a preference pair becomes tokens)
    "load_tokenizer", "render_preference",
    # sampling
    "Completion", "Request", "SamplingParams", "expand_requests",
    # models and importers
    "CausalLM", "FUSED", "HFImporter", "ModelConfig", "PER_EXPERT", "TensorMap",
    "common_fields_from_hf", "common_fields_to_hf", "dense_mlp_map", "export_model_type",
    "load_importer", "load_pretrained", "load_state_dict_strict", "qwen_sliding_window", "qwen_sliding_window_to_hf",
    "read_hf_config", "read_hf_weights", "rename", "require", "save_pretrained", "split_gate_up",
    "stack_experts", "staged_directory", "write_manifest",
    # distributed: a sharded policy's parameters gathered for a block (a collective)
    "unsharded",
    # weight pushes from a sharded trainer, one bucket of full tensors at a time
    "Deferred", "hf_name_prefix", "iter_full_buckets", "iter_hf_push_buckets", "iter_push_buckets",
    "save_hf_directory",
    "shipped_code_modules",
    # LoRA and the chunked head
    "chunked_logits_map", "chunked_logprobs", "has_chunked_head", "has_lora", "merge_and_unload", "merged_state_dict",
    "target_logprobs",
    # devices, plugins, errors, logging
    "AcceleratorBackend", "AdvantageEstimatorProtocol", "AstraiError", "CheckpointError", "ConfigError",
    "DataError", "DeviceBackend", "FieldError", "resolve_device", "PluginError", "PolicyLossProtocol",
    "RewardFunctionProtocol",
    "SamplerProtocol", "StrategyProtocol", "get_logger", "process_registry",
    "NO_CAPABILITIES", "SamplerCapabilities", "sampler_capabilities",
    # trackers (trainer.report_to): what start() gets, and the built-ins' base class
    "TrackedRun", "Tracker", "TrackerOptions", "TrackerProtocol",
]
