"""`astrai train`: build a run from its config and train.

Everything that can be checked is checked before any work starts (config shape,
component names and options, paths, the resume checkpoint), so a mistake costs
seconds and leaves nothing behind.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from astrai_core.config.components import component_params
from astrai_core.config.loader import format_validation_error
from astrai_core.config.schema import ModelSection, RunConfig
from astrai_core.devices.select import resolve_device
from astrai_core.errors import CheckpointError, ConfigError
from astrai_core.log import get_logger
from astrai_core.plugins import load_plugins
from astrai_core.registry import Registry
from astrai_core.training import checkpointing as ckpt
from astrai_core.training.config import TrainerConfig
from astrai_core.training.context import TrainContext
from astrai_core.training.strategy import Strategy
from astrai_core.training.trainer import Trainer

log = get_logger("astrai.train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Run ``config`` to completion; returns the last logged metrics."""
    context, strategy = prepare_run(config, resume=resume, overwrite=overwrite)
    return Trainer(context, strategy).fit(resume=resume)


def prepare_run(config: RunConfig, *, resume: bool = False, overwrite: bool = False,
                base_dir: Path | None = None) -> tuple[TrainContext, Strategy]:
    """Check ``config`` whole, then build the context and the strategy (not yet set up).

    ``base_dir`` resolves relative data paths (default: the current directory).
    """
    source = getattr(config, "_source", None)
    registry = load_plugins()
    trainer_config = _section(TrainerConfig, config.trainer, ("trainer",), source)
    strategy_class, strategy_config = _strategy(registry, config, source)
    _check_advantage(registry, config, strategy_class, source)
    device_params = component_params(registry, "device_backend", config.device.name,
                                     config.device.params, ("device",), source) \
        if config.device.name != "auto" else {}
    output_dir = Path(config.output_dir)
    _check_output_dir(output_dir, resume, overwrite)

    backend = resolve_device(registry, config.device.name, **device_params)
    _seed_everything(trainer_config.seed, backend)
    device = backend.device(0)
    tokenizer_dir = _tokenizer_dir(config.model)
    from astrai_core.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    model = build_model(config.model, tokenizer, source).to(device)
    context = TrainContext(run_config=config, trainer_config=trainer_config, registry=registry,
                           backend=backend, device=device, model=model, tokenizer=tokenizer,
                           tokenizer_dir=tokenizer_dir, base_dir=base_dir or Path.cwd(),
                           output_dir=output_dir)
    _check_components(context)
    strategy = strategy_class(strategy_config, context)
    log.info("training", strategy=config.strategy.name, device=str(device),
             parameters=sum(p.numel() for p in model.parameters()), output_dir=str(output_dir))
    return context, strategy


def _check_components(context: TrainContext) -> None:
    """Build the sections that are only used later, so their mistakes surface now."""
    config = context.run_config
    if config.rewards:
        context.rewards()
    if config.sampler is not None:
        context.sampler_options()
    if config.advantage is not None:
        context.advantage_estimator(None)


def _strategy(registry: Registry, config: RunConfig, source: Any) -> tuple[type[Strategy], Any]:
    params = component_params(registry, "strategy", config.strategy.name, config.strategy.params,
                              ("strategy",), source)
    strategy_class = registry.get("strategy", config.strategy.name).load()
    return strategy_class, strategy_class.Config.model_validate(params)


def _check_advantage(registry: Registry, config: RunConfig, strategy_class: type[Strategy],
                     source: Any) -> None:
    """An online strategy's estimator (its `advantage:` section or its default), checked now."""
    if not strategy_class.online:
        return
    section = config.advantage
    if section is not None:
        component_params(registry, "advantage_estimator", section.name, section.params,
                         ("advantage",), source)
        return
    default = getattr(strategy_class, "default_advantage", None)
    if default is None:
        raise ConfigError(f"advantage: strategy {config.strategy.name!r} needs an "
                          "`advantage: {name: ...}` section")
    if not registry.has("advantage_estimator", default):
        where = f"{source.where(('strategy', 'name'))}: " if source is not None else ""
        raise ConfigError(
            f"{where}strategy.name: {config.strategy.name!r} needs the advantage estimator "
            f"{default!r} (its default; an `advantage:` section can choose another): "
            f"{registry.unknown_message('advantage_estimator', default)}")


def _section(model: type, data: dict[str, Any], path: tuple, source: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, path)) from None


def _check_output_dir(output_dir: Path, resume: bool, overwrite: bool) -> None:
    if resume:
        ckpt.latest_checkpoint(output_dir)  # fails now, before any work, when there is none
        return
    existing = ckpt.list_checkpoints(output_dir)
    if existing and not overwrite:
        raise CheckpointError(
            f"{output_dir} already holds checkpoints (newest: {existing[-1][1].name}); "
            "continue it with --resume, start over with --overwrite, or pick another output_dir"
        )
    if overwrite:
        shutil.rmtree(output_dir / "checkpoints", ignore_errors=True)


def _seed_everything(seed: int, backend: Any) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    backend.manual_seed(seed)


def _tokenizer_dir(section: ModelSection) -> Path:
    directory = Path(section.tokenizer or section.path)
    if not directory.is_dir():
        field = "model.tokenizer" if section.tokenizer else "model.path"
        raise ConfigError(f"{field}: directory {str(directory)!r} does not exist")
    return directory


def build_model(section: ModelSection, tokenizer: Any, source: Any = None) -> torch.nn.Module:
    """Load the checkpoint at ``model.path`` or build ``model.config`` from scratch."""
    from astrai_core.model import CausalLM, ModelConfig, load_pretrained

    dtype = DTYPES[section.dtype]
    if section.path is not None:
        if not Path(section.path).is_dir():
            raise ConfigError(f"model.path: checkpoint directory {section.path!r} does not exist")
        return load_pretrained(section.path, dtype=dtype).train()
    fields = dict(section.config or {})
    fields.setdefault("vocab_size", len(tokenizer))
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            fields.setdefault(name, value)
    model_config = _section(ModelConfig, fields, ("model", "config"), source)
    if model_config.vocab_size < len(tokenizer):
        raise ConfigError(f"model.config.vocab_size: {model_config.vocab_size} is smaller than "
                          f"the tokenizer's {len(tokenizer)} tokens")
    return CausalLM(model_config).to(dtype).train()
