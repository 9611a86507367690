"""`astrai train`: plan a run from its config, wire its components, and train.

Everything that can be checked is checked by the run plan before any work starts (config
shape, component names and options, cross-section rules), then the output directory and
the resume checkpoint; only then are the tokenizer, the model and the rest built, once,
by :func:`prepare_run`.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from astrai_core.checkpoints import training_state as ckpt
from astrai_core.checkpoints.model_source import NATIVE, TRANSFORMERS, model_directory
from astrai_core.config.loader import validate_model
from astrai_core.config.plan import RunPlan, plan_run
from astrai_core.config.schema import ModelSection, RunConfig
from astrai_core.config.yaml_source import YamlSource
from astrai_core.devices.select import resolve_device
from astrai_core.distributed.context import SINGLE, DistContext, init_distributed
from astrai_core.distributed.data import shard_loader
from astrai_core.distributed.fsdp import UnshardedSampler, shard_run
from astrai_core.errors import CheckpointError, ConfigError, FieldError
from astrai_core.log import get_logger
from astrai_core.plugins.registry import Registry
from astrai_core.plugins.sampler_capabilities import (NO_CAPABILITIES, SamplerCapabilities,
                                                      sampler_capabilities)
from astrai_core.training.phases import PhaseHook
from astrai_core.training.run_components import RunComponents
from astrai_core.training.strategy import Strategy
from astrai_core.training.trainer import Trainer

log = get_logger("astrai.train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def train(config: RunConfig, *, source: YamlSource | None = None, resume: bool = False,
          overwrite: bool = False, phase_hook: PhaseHook | None = None) -> dict[str, Any]:
    """Run ``config`` to completion; returns the last logged metrics. ``phase_hook`` is
    called at each named phase of the run (:mod:`astrai_core.training.phases`).

    A ``resume`` whose checkpoint already reached ``trainer.max_steps`` has nothing to
    do: it says so in one line and returns ``{}`` (the CLI exits 0).
    """
    with _numerics_restored():
        try:
            run, strategy = prepare_run(config, source=source, resume=resume, overwrite=overwrite)
        except NothingToResume as done:
            log.warning(str(done))
            return {}
        try:
            metrics = Trainer(run, strategy, phase_hook=phase_hook).fit(resume=resume)
        finally:  # a sampler holding processes (ray workers, a vLLM engine) lets them go
            if run.sampler is not None and run.sampler_capabilities.needs_close:
                run.sampler.close()
        run.dist.finish()
        return metrics


class NothingToResume(CheckpointError):
    """``--resume`` found a checkpoint at or past ``trainer.max_steps``."""


def prepare_run(config: RunConfig, *, source: YamlSource | None = None, resume: bool = False,
                overwrite: bool = False, base_dir: Path | None = None,
                registry: Registry | None = None) -> tuple[RunComponents, Strategy]:
    """Plan ``config`` whole, then build its components once and the strategy on them.

    ``base_dir`` resolves relative data paths (default: the current directory).
    """
    base_dir = base_dir or Path.cwd()
    plan = plan_run(config, source, registry, base_dir)
    output_dir = Path(config.output_dir)
    _check_output_dir(output_dir, resume, overwrite, config.trainer.max_steps)
    # model.path as a directory to load: a Hugging Face one run natively is imported
    # (once: cached) here, after the plan and before anything else is built
    model_dir = (None if plan.model_source is None else
                 model_directory(plan.model_source, plan.registry, config.model.cache_dir))
    tokenizer_dir = Path(config.model.tokenizer) if config.model.tokenizer else model_dir
    backend = resolve_device(plan.registry, config.device.name,
                             **(plan.device.options if plan.device else {}))
    _check_memory(plan, backend)
    dist = init_distributed(backend, config.parallel)
    _seed_everything(config.trainer.seed, backend)  # the same on every rank: one initial model
    device = dist.device if dist.enabled else backend.device(0)
    _pin_numerics(config.trainer, device)
    from astrai_core.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    backend_name = plan.model_source.backend if plan.model_source is not None else NATIVE
    model = build_model(config.model, tokenizer, source, model_dir, backend_name).to(device)
    run = wire_components(plan, backend=backend, device=device, model=model,
                          tokenizer=tokenizer, tokenizer_dir=tokenizer_dir, base_dir=base_dir,
                          dist=dist, model_dir=model_dir)
    strategy = plan.strategy.target(plan.strategy.config, run)
    shard_run(run, strategy)  # FSDP2 over the mesh (distributed), activation checkpointing
    log.info("training", strategy=plan.strategy.name, device=str(device),
             parameters=sum(p.numel() for p in model.parameters()), output_dir=str(output_dir))
    return run, strategy


def _check_memory(plan: RunPlan, backend: Any) -> None:
    """Sizes whose activations cannot fit the device are refused before the model loads (and
    a default sequence length past the model's context is warned of)."""
    from astrai_core.config.model_fit import check_memory, warn_default_seq_len
    from astrai_core.config.plan import Resolver

    warn_default_seq_len(plan.config, plan.model_source)
    try:
        available = getattr(backend, "available_memory", lambda: None)()  # a plugin's may lack it
        check_memory(plan.config, plan.model_source, available, f"{backend.name} memory")
    except FieldError as exc:
        raise Resolver(plan.registry, plan.source).error(exc.path, exc.message) from None


def _generates_from_policy(plan: RunPlan, capabilities: SamplerCapabilities) -> bool:
    """Whether the sampler generates from the trainer's own parameters, so a distributed
    trainer gathers them for it. Not a sampler outside the trainer's processes (its spec
    says ``asynchronous``: ray) nor one with its own copy of the weights in the trainer's
    process (it declares ``owns_weights``: vllm's engine); both take the sharded policy's
    weights through their own ``update_weights``."""
    return not _asynchronous(plan) and not capabilities.owns_weights


def _asynchronous(plan: RunPlan) -> bool:
    """The run's sampler's ``SamplerSpec.asynchronous``: it generates apart from the trainer."""
    return plan.registry.get("sampler", plan.sampler.name).asynchronous


def wire_components(plan: RunPlan, *, backend: Any, device: torch.device, model: torch.nn.Module,
                    tokenizer: Any, tokenizer_dir: Path, base_dir: Path,
                    dist: DistContext = SINGLE, model_dir: Path | None = None) -> RunComponents:
    """Data loaders, rewards, sampler, estimator, policy loss and rollout runner, as the
    plan says. Distributed (``dist``): the training loader and the rollouts are this
    rank's share; evaluation is split over the ranks (training/evaluation.py). ``model_dir``:
    the directory the policy was loaded from (None: from scratch)."""
    from astrai_core.data import build_eval_loader
    from astrai_core.rewards.reward_set import RewardSet
    from astrai_core.rollout.runner import RecordStream, RolloutRunner
    from astrai_core.rollout.samples import RolloutSampleLog
    config, needs = plan.config, plan.needs
    data = config.data.resolve_paths(base_dir)
    required = {choice.label: choice.required_columns for choice in plan.rewards}
    environment = plan.environment.target(**plan.environment.options) if plan.environment else None
    tools = getattr(environment, "prompt_tools", None)  # rendered into prompts by the template
    train_loader = _train_loader(plan, data, tokenizer, required, tools, environment, dist)
    eval_loader = build_eval_loader(data, tokenizer, required_columns=required, tools=tools)
    eval_sets = {named.name: build_eval_loader(data.model_copy(update={"eval": named}), tokenizer,
                                               required_columns=required, tools=tools)
                 for named in data.eval_sets}
    rewards = RewardSet.from_choices(plan.rewards)
    sampling = rollout_sampling(plan, tokenizer)
    generates = needs.rollouts or needs.generates or any(
        loader.kind == "prompt" for loader in [eval_loader, *eval_sets.values()] if loader is not None)
    engine = plan.sampling_fields()[1]
    sampler = plan.sampler.target(model=model, tokenizer=tokenizer, **engine) if generates else None
    # read once, here: whoever acts on a capability is handed this record
    capabilities = NO_CAPABILITIES if sampler is None else sampler_capabilities(sampler)
    if sampler is not None and dist.enabled and _generates_from_policy(plan, capabilities):
        sampler = UnshardedSampler(sampler, model)  # gathers the policy once per generate
    estimator = plan.advantage.target(**plan.advantage.options) if plan.advantage else None
    policy_loss = (plan.policy_loss.target(**plan.policy_loss.options)
                   if plan.policy_loss else None)
    pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0
    episodes = (build_episodes(plan, environment, sampler, tokenizer, rewards, pad_token_id)
                if generates else None)
    rollouts = None
    if needs.rollouts:
        rollouts = RolloutRunner(sampler, tokenizer, rewards, sampling, group_size=needs.group_size,
                                 prompt_source=RecordStream(train_loader),
                                 prompts_per_rollout=data.batch_size // dist.world_size,
                                 prompt_share=(dist.context_rank, dist.context_size),
                                 pad_token_id=pad_token_id, episodes=episodes,
                                 seed_offset=dist.sampling_slice(data.batch_size).start,
                                 record_routing=needs.sampler_routing,  # router_replay: R3
                                 capabilities=capabilities,
                                 asynchronous=_asynchronous(plan))
        if config.rollout.log_samples:
            rollouts.sample_log = RolloutSampleLog(config.rollout.log_samples,
                                                   config.rollout.log_samples_count, tokenizer)
    return RunComponents(
        plan=plan, trainer=config.trainer, data=data, registry=plan.registry, backend=backend,
        device=device, model=model, tokenizer=tokenizer, tokenizer_dir=tokenizer_dir,
        output_dir=Path(config.output_dir), initial_model_dir=model_dir, sampling=sampling,
        rewards=rewards, train_loader=train_loader, eval_loader=eval_loader, sampler=sampler,
        estimator=estimator, rollouts=rollouts, policy_loss=policy_loss, dist=dist,
        episodes=episodes, eval_sets=eval_sets, sampler_capabilities=capabilities)


def _train_loader(plan: RunPlan, data: Any, tokenizer: Any, required: dict[str, Any],
                  tools: list[dict] | None, environment: Any, dist: DistContext) -> Any:
    """The training loader, this rank's share; prompts with images are checked against
    the options that cannot carry them (rollout/images.py) before anything trains."""
    from astrai_core.data import build_train_loader
    from astrai_core.rollout.images import check_image_prompts

    needs = plan.needs
    loader = build_train_loader(data, tokenizer, formats=needs.data_formats,
                                required_columns=required if needs.rollouts else {},
                                tools=tools)
    if needs.rollouts and getattr(loader, "has_images", False):
        multi_turn = environment is not None and not getattr(environment, "single_turn", False)
        check_image_prompts(plan.config, sampler_capabilities(plan.sampler.target), multi_turn,
                            dist.world_size, getattr(loader, "mixes_images", False))
    return shard_loader(loader, dist)


def build_episodes(plan: RunPlan, environment: Any, sampler: Any, tokenizer: Any, rewards: Any,
                   pad_token_id: int) -> Any:
    """The episode runner of a multi-turn ``environment``; None for none or ``single_turn``.
    An environment that plays its episodes itself (``episode_runner``, see
    :class:`~astrai_core.plugins.protocols.EnvironmentProtocol`) builds its own runner."""
    if environment is None or getattr(environment, "single_turn", False):
        return None
    own = getattr(environment, "episode_runner", None)
    if own is not None:
        return own(sampler=sampler, tokenizer=tokenizer, rewards=rewards, config=plan.episode,
                   pad_token_id=pad_token_id)
    from astrai_core.rollout.episodes import EpisodeRunner

    return EpisodeRunner(environment, sampler, tokenizer, rewards, plan.episode,
                         pad_token_id=pad_token_id)


def rollout_sampling(plan: RunPlan, tokenizer: Any) -> Any:
    """The rollouts' default SamplingParams: the sampler section's fields. Without an
    explicit ``stop_token_ids`` a completion stops at the tokenizer's EOS, as in
    evaluation; ``stop_token_ids: []`` means no stop token."""
    from astrai_core.sampling.params import SamplingParams

    fields = plan.sampling_fields()[0]
    eos = getattr(tokenizer, "eos_token_id", None)
    if not plan.user_set("sampler", "stop_token_ids") and eos is not None:
        fields["stop_token_ids"] = (eos,)
    return SamplingParams(**fields)


def _check_output_dir(output_dir: Path, resume: bool, overwrite: bool, max_steps: int) -> None:
    """Refuse to overwrite an earlier run's checkpoints or metrics without --overwrite;
    remove what a run killed while saving left behind."""
    ckpt.remove_stale_staging(output_dir)
    if resume:
        # fails now, before any work, when none verifies; the first process sets aside
        # the newer ones that do not (the resumed run writes those steps anew)
        step, newest = ckpt.latest_checkpoint(output_dir,
                                              set_aside=os.environ.get("RANK", "0") == "0")
        if step >= max_steps:
            raise NothingToResume(
                f"nothing to do: {newest} is at step {step} and trainer.max_steps is "
                f"{max_steps}; raise it (--set trainer.max_steps=N) to train further")
        return
    existing = ckpt.list_checkpoints(output_dir)
    metrics = output_dir / "metrics.jsonl"
    if overwrite:
        shutil.rmtree(output_dir / "checkpoints", ignore_errors=True)
        return
    if existing:
        raise CheckpointError(
            f"{output_dir} already holds checkpoints (newest: {existing[-1][1].name}); "
            "continue it with --resume, start over with --overwrite, or pick another output_dir"
        )
    if metrics.is_file() and metrics.stat().st_size > 0:
        raise CheckpointError(
            f"{metrics} already holds an earlier run's metrics (and no checkpoint to resume "
            "from); start over with --overwrite, or pick another output_dir")


def _pin_numerics(trainer: Any, device: torch.device) -> None:
    """Fix what else decides the numbers on this machine: the CPU thread count (1 and 2
    threads give the sampler different last bits) and, on a CPU device, deterministic
    algorithms (measured not to change a run's numbers; see docs/user-guide.md)."""
    if trainer.threads is not None:
        torch.set_num_threads(trainer.threads)
    if trainer.deterministic and device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)


@contextmanager
def _numerics_restored() -> Iterator[None]:
    """Give the caller back torch's thread count and deterministic mode as they were:
    ``train`` pins them for its run, and code that runs after it in the same process (a
    notebook, a benchmark's peer) must not inherit them. Deterministic mode alone made
    TRL's GRPO step 1.5x slower (it fills every ``torch.empty`` with NaN)."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def _seed_everything(seed: int, backend: Any) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    backend.manual_seed(seed)


def build_model(section: ModelSection, tokenizer: Any, source: YamlSource | None = None,
                model_dir: Path | None = None, backend: str = NATIVE) -> torch.nn.Module:
    """Load the checkpoint at ``model_dir`` (``model.path`` resolved) with ``backend``
    (native, or transformers for a Hugging Face directory; a vision-language model's
    ``model.freeze`` parts frozen) or build ``model.config`` from scratch, and add the
    ``model.lora`` adapter when there is one."""
    if backend == TRANSFORMERS:
        from astrai_core.checkpoints.hf_model import load_transformers_model

        from astrai_core.model_backends.vision import freeze_parts

        model = load_transformers_model(model_dir, dtype=DTYPES[section.dtype],
                                        trust_remote_code=section.trust_remote_code).train()
        freeze_parts(model.hf, section.freeze)
    else:
        model = _build_base(section, tokenizer, source, model_dir)
    if section.lora is not None:  # peft adapter; only it trains (model/lora.py)
        from astrai_core.checkpoints.lora_files import attach_lora

        model = attach_lora(model, section.lora, model_dir).train()
    return model


def _build_base(section: ModelSection, tokenizer: Any, source: YamlSource | None,
                model_dir: Path | None) -> torch.nn.Module:
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.model import CausalLM, ModelConfig

    dtype = DTYPES[section.dtype]
    if model_dir is not None:
        return load_pretrained(model_dir, dtype=dtype).train()
    fields = dict(section.config or {})
    fields.setdefault("vocab_size", len(tokenizer))
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            fields.setdefault(name, value)
    model_config = validate_model(ModelConfig, fields, source, ("model", "config"))
    if model_config.vocab_size < len(tokenizer):
        raise ConfigError(f"model.config.vocab_size: {model_config.vocab_size} is smaller than "
                          f"the tokenizer's {len(tokenizer)} tokens")
    return CausalLM(model_config).to(dtype).train()
