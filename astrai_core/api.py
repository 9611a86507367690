"""The public API for plugins: everything a plugin's targets may import from the core.

Plugins import from here (and ``hookimpl`` plus the ``*Spec`` records from ``astrai_core``)
and from nowhere else in the core; a test holds every plugin in this repository to it, and
another holds every name here to a use (a plugin, the test kit or the documentation).
These names keep their meaning across minor releases; everything else in the core may
move. Importing this module imports torch, so hookimpl modules must not import it at
module level: targets do (see docs/plugins.md).

The names are grouped by what a plugin does with them, in the same order below and in
``__all__``.
"""

# Strategies: the base classes, what a run hands them, what they ask of the run, the
# modules they train or freeze, and where each step's batches come from.
from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.plugins.protocols import StrategyProtocol
from astrai_core.config.online import OnlineConfig
from astrai_core.online.source import RolloutSource
from astrai_core.online.strategy import OnlineStrategy
from astrai_core.training.batch_sources import BatchSource, LoaderSource
from astrai_core.training.modules import TrainedModule, frozen_copy, frozen_reference
from astrai_core.training.run_components import RunComponents
from astrai_core.training.strategy import Strategy

# Rollouts: the batch an online strategy trains on, and the trainer-side forward over it.
from astrai_core.rollout.batch import RolloutBatch, episode_tensors, pad_rows
from astrai_core.rollout.episodes import episode_turn_seed
from astrai_core.rollout.forward import policy_forward, rollout_forward
from astrai_core.rollout.gather import context_group_rollout
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.rollout.runner import RolloutRunner

# RL maths: masked reductions, group statistics, log-probs, KL, entropy, the clipped
# surrogate; pure tensor functions.
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

# Advantage estimators and policy losses: the estimator base, the protocols their targets
# implement, the objective the RL strategies share, and rollout correction's weights on a
# policy loss.
from astrai_core.plugins.protocols import AdvantageEstimatorProtocol, PolicyLossProtocol
from astrai_core.rl.estimator import AdvantageEstimator
from astrai_core.rl.objective import ObjectiveSettings, PolicyObjective
from astrai_core.rl.options import (
    AggregationOption,
    AuxLossOption,
    EntropyOption,
    KLEstimator,
    KLEstimatorOption,
    KLPenaltyOption,
    LossAggregationOptions,
    redefault,
)
from astrai_core.rl.policy_losses import apply_rollout_weights

# Samplers: the protocol, what generate gets and what it returns.
from astrai_core.plugins.protocols import SamplerProtocol
from astrai_core.plugins.sampler_capabilities import (NO_CAPABILITIES, SamplerCapabilities,
                                                      sampler_capabilities)
from astrai_core.sampling.params import Completion, SamplingParams
from astrai_core.sampling.requests import Request, expand_requests

# Weights: a sharded policy's parameters gathered for a block (a collective), pushes to a
# sampler one bucket of full tensors at a time, a Hugging Face copy for an engine, LoRA merged.
from astrai_core.checkpoints.hf_model import save_hf_directory
from astrai_core.checkpoints.hf_push import hf_name_prefix, iter_hf_push_buckets
from astrai_core.distributed.fsdp import unsharded
from astrai_core.distributed.weight_delta import (DeltaEncoder, DeltaManifest, DeltaMirror,
                                                  WeightPushMismatch, apply_delta, state_digest)
from astrai_core.distributed.weight_gather import iter_full_buckets, iter_push_buckets
from astrai_core.model.lora import merge_and_unload, merged_state_dict
from astrai_core.model_backends.transformers_lm import shipped_code_modules

# Rewards: the reward-function protocol.
from astrai_core.plugins.protocols import RewardFunctionProtocol

# Environments of multi-turn rollouts, and the in-process serving engine that an
# environment with its own agent drives (chat prompts, engine requests, Hermes tool calls).
from astrai_core.environments import AssistantTurn, EnvMessage, EnvStep, ToolCall
from astrai_core.plugins.protocols import EnvironmentProtocol
from astrai_core.rollout.env_render import MessageRenderer
from astrai_core.serving.hermes import END_TAG, parse_hermes
from astrai_core.serving.prompts import chat_prompt
from astrai_core.serving.protocol import ChatCompletionRequest
from astrai_core.serving.sampler_engine import SamplerEngine
from astrai_core.serving.sequence import EngineRequest, FinishEvent

# Data: tokenizers, and how a preference pair becomes tokens.
from astrai_core.data.image_batch import keep_prompt_images, model_images, prompt_images
from astrai_core.data.images import open_image
from astrai_core.data.loader import both_sides
from astrai_core.data.render import render_preference
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.data.vision_render import process_prompt, processor_of

# Models and importers: the native model and its checkpoints, the chunked head (losses
# without [B, S, V] logits), and the pieces of a Hugging Face importer.
from astrai_core.checkpoints.hf.base import FUSED, PER_EXPERT, HFImporter, dense_mlp_map
from astrai_core.checkpoints.hf.config import (
    common_fields_from_hf,
    common_fields_to_hf,
    qwen_sliding_window,
    qwen_sliding_window_to_hf,
    require,
)
from astrai_core.checkpoints.hf.files import read_hf_config, read_hf_weights, staged_directory
from astrai_core.checkpoints.hf.select import export_model_type, load_importer
from astrai_core.checkpoints.hf.tensor_map import TensorMap, rename, split_gate_up, stack_experts
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.checkpoints.native import load_pretrained, load_state_dict_strict, save_pretrained
from astrai_core.checkpoints.strategy_record import write_strategy_record
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.model.head import (
    chunked_logits_map,
    chunked_logprobs,
    has_chunked_head,
    target_logprobs,
)

# Devices, the plugin registry, errors and logging.
from astrai_core.devices.accelerator import AcceleratorBackend
from astrai_core.devices.base import DeviceBackend
from astrai_core.devices.select import resolve_device
from astrai_core.distributed.context_forward import (
    context_split,
    context_target_logprobs,
    local_part,
    splits_rows,
)
from astrai_core.distributed.context_rows import gather_shards
from astrai_core.distributed.loopback import LOOPBACK, bound_store, loopback_collectives
from astrai_core.distributed.world import launched_world_size, scoped_env
from astrai_core.errors import (
    AstraiError,
    CheckpointError,
    ConfigError,
    DataError,
    FieldError,
    PluginError,
)
from astrai_core.log import get_logger
from astrai_core.plugins import process_registry

# Trackers (trainer.report_to): the protocol, what start() gets, the built-ins' base class.
from astrai_core.plugins.protocols import TrackerProtocol
from astrai_core.trackers.base import TrackedRun, Tracker, TrackerOptions

__all__ = [
    # strategies
    "BatchSource", "LoaderSource", "OnlineConfig", "OnlineStrategy", "RolloutSource",
    "RunComponents", "RunConfig", "Strategy", "StrategyNeeds", "StrategyProtocol",
    "TrainedModule", "frozen_copy", "frozen_reference",
    # rollouts
    "RolloutBatch", "RolloutRunner", "episode_tensors", "episode_turn_seed", "pad_rows",
    "context_group_rollout", "policy_forward", "rollout_forward", "rollout_metrics",
    # RL maths
    "aggregate_loss", "broadcast_to_tokens", "clipped_policy_loss", "entropy_from_logits",
    "explained_variance", "group_stats", "kl_estimate", "masked_mean", "masked_sum",
    "masked_var", "masked_whiten", "sequence_scores", "token_logprobs",
    "token_rewards_from_scores",
    # advantage estimators and policy losses
    "AdvantageEstimator", "AdvantageEstimatorProtocol", "ObjectiveSettings", "PolicyLossProtocol",
    "PolicyObjective", "apply_rollout_weights",
    # the loss options strategy configs share (one owner per field)
    "AggregationOption", "AuxLossOption", "EntropyOption", "KLEstimator", "KLEstimatorOption",
    "KLPenaltyOption", "LossAggregationOptions", "redefault",
    # samplers
    "Completion", "NO_CAPABILITIES", "Request", "SamplerCapabilities", "SamplerProtocol",
    "SamplingParams", "expand_requests", "sampler_capabilities",
    # weights
    "DeltaEncoder", "DeltaManifest", "DeltaMirror", "WeightPushMismatch", "apply_delta", "state_digest",
    "hf_name_prefix", "iter_full_buckets", "iter_hf_push_buckets", "iter_push_buckets",
    "merge_and_unload", "merged_state_dict", "save_hf_directory", "shipped_code_modules",
    "unsharded",
    # rewards
    "RewardFunctionProtocol",
    # environments, and the in-process serving engine
    "AssistantTurn", "EnvMessage", "EnvStep", "EnvironmentProtocol", "MessageRenderer", "ToolCall",
    "ChatCompletionRequest", "END_TAG", "EngineRequest", "FinishEvent", "SamplerEngine",
    "chat_prompt", "parse_hermes",
    # data
    "load_tokenizer", "render_preference", "both_sides", "keep_prompt_images", "model_images",
    "open_image", "process_prompt", "processor_of", "prompt_images",
    # models and importers
    "CausalLM", "ModelConfig", "load_pretrained", "load_state_dict_strict", "save_pretrained",
    "write_manifest",
    "chunked_logits_map", "chunked_logprobs", "has_chunked_head", "target_logprobs",
    "FUSED", "HFImporter", "PER_EXPERT", "TensorMap", "common_fields_from_hf",
    "common_fields_to_hf", "dense_mlp_map", "export_model_type", "load_importer",
    "qwen_sliding_window", "qwen_sliding_window_to_hf", "read_hf_config", "read_hf_weights",
    "rename", "require", "split_gate_up", "stack_experts", "staged_directory",
    "write_strategy_record",
    # devices, plugins, errors, logging
    "AcceleratorBackend", "DeviceBackend", "resolve_device", "process_registry", "scoped_env",
    "LOOPBACK", "bound_store", "launched_world_size", "loopback_collectives",
    # context parallelism: whole-row forwards over each rank's token shard
    "context_split", "context_target_logprobs", "gather_shards", "local_part", "splits_rows",
    "AstraiError", "CheckpointError", "ConfigError", "DataError", "FieldError", "PluginError",
    "get_logger",
    # trackers
    "TrackedRun", "Tracker", "TrackerOptions", "TrackerProtocol",
]
