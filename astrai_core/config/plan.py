"""The run plan: a config checked whole, before the tokenizer or the model is loaded.

:func:`plan_run` resolves every pluggable section (strategy, advantage, sampler, rewards,
device) into its loaded target and validated options through one :class:`Resolver`, then
runs every cross-section check (and sets ``data.max_prompt_len``'s default from the
model's context): the policy loss an online strategy composes, the data formats the
strategy reads, the evaluation format, the advantage estimator an online strategy needs
and whether it wants values, the reward functions and the columns they need, the
strategy's own checks, and the online options (:mod:`astrai_core.config.online`: one
function per option, from ``trainer.micro_batch_tokens`` to ``strategy.router_replay``).

Every mistake becomes one :class:`ConfigError` of the shape
``file:line: dotted.path: message`` (see :func:`astrai_core.config.loader.field_message`),
so `astrai train` prints one ``error:`` line and exits with status 2 having written nothing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from astrai_core.checkpoints.model_source import TRANSFORMERS, ModelSource, describe
from astrai_core.config.loader import field_message, format_validation_error
from astrai_core.config.online import OnlineConfig, check_online_options
from astrai_core.config.model_fit import check_model_fit
from astrai_core.config.context_parallel import check_context_parallel
from astrai_core.config.prompt_budget import resolve_max_prompt_len
from astrai_core.config.schema import ComponentSection, RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.config.yaml_source import FieldPath, YamlSource
from astrai_core.data.config import BATCH_KIND
from astrai_core.distributed.mesh import check_parallel
from astrai_core.distributed.world import launched_world_size
from astrai_core.environments.episode_config import DEFAULT_ENVIRONMENT, EpisodeConfig
from astrai_core.errors import ConfigError, FieldError, PluginError
from astrai_core.plugins.protocols import missing_members
from astrai_core.plugins.registry import Registry
from astrai_core.plugins.specs import import_target

DEFAULT_SAMPLER = "torch"


@dataclass(frozen=True)
class Component:
    """A pluggable section resolved: its loaded target and its validated options."""

    kind: str
    name: str
    target: Any
    options: dict[str, Any]
    config: BaseModel | None = None      # the validated ``Config`` instance, when it has one


@dataclass(frozen=True)
class RewardChoice:
    """One ``rewards:`` entry resolved into the callable that scores completions."""

    label: str                           # metric name: ``mypkg.rewards:my_fn`` -> ``my_fn``
    weight: float
    fn: Any                              # a function target itself, or a class target built
    required_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    """Everything `astrai train` will build, named and validated."""

    config: RunConfig
    source: YamlSource | None
    registry: Registry
    strategy: Component
    needs: StrategyNeeds
    advantage: Component | None
    sampler: Component
    rewards: tuple[RewardChoice, ...]
    device: Component | None             # None: ``device: {name: auto}``
    policy_loss: Component | None = None  # the strategy's policy loss (online strategies)
    environment: Component | None = None  # rollouts' and evaluation's environment
    episode: EpisodeConfig | None = None  # its episode keys (max_turns, ...)
    trackers: tuple[Component, ...] = ()  # trainer.report_to, in order
    model_source: ModelSource | None = None  # model.path resolved (None: from scratch)

    def sampling_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the sampler section's SamplingParams fields, its engine options)."""
        return _split_sampling(self.sampler.options)

    def user_set(self, *path: Any) -> bool:
        """Whether the config itself gives ``path`` (e.g. ``("sampler", "stop_token_ids")``)."""
        node: Any = self.config.model_dump(exclude_unset=True)
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True


class Resolver:
    """Names to loaded, validated components: one path and one error formatter."""

    def __init__(self, registry: Registry, source: YamlSource | None = None) -> None:
        self.registry = registry
        self.source = source

    def error(self, path: FieldPath, message: str) -> ConfigError:
        return ConfigError(field_message(self.source, path, message))

    def component(self, kind: str, name: str, params: dict[str, Any],
                  path: FieldPath) -> Component:
        """``kind``/``name`` loaded from the registry, with ``params`` validated."""
        target = self._load(kind, name, path)
        config = self._validated(target, params, path)
        options = config.model_dump() if config is not None else dict(params)
        return Component(kind, name, target, options, config)

    def _load(self, kind: str, name: str, path: FieldPath) -> Any:
        try:
            return self.registry.load(kind, name)
        except PluginError as exc:
            raise self.error(path + ("name",), str(exc)) from None

    def section(self, kind: str, section: ComponentSection, path: FieldPath) -> Component:
        return self.component(kind, section.name, section.params, path)

    def sampler(self, section: ComponentSection, path: FieldPath) -> Component:
        """The ``sampler:`` section. A sampler is built as ``Sampler(model=..., tokenizer=...,
        **engine_options)`` and receives SamplingParams in ``generate``: without a ``Config``
        (which validates the whole section), the section's SamplingParams fields are
        validated as such and only the other keys are checked against ``__init__``."""
        target = self._load("sampler", section.name, path)
        if _config_model(target) is not None:
            return self.component("sampler", section.name, section.params, path)
        from astrai_core.sampling.params import SamplingParams

        sampling, engine = _split_sampling(section.params)
        self._validated(target, engine, path)
        try:
            fields = SamplingParams.model_validate(sampling).model_dump(include=set(sampling))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, self.source, path)) from None
        return Component("sampler", section.name, target, {**fields, **engine}, None)

    def reward(self, name: str, weight: float, params: dict[str, Any],
               path: FieldPath) -> RewardChoice:
        """A ``rewards:`` entry: a registered name, or ``module.path:function`` imported as is."""
        if ":" in name:
            try:
                target = import_target(name)
            except Exception as exc:
                raise self.error(path + ("name",), f"reward {name!r} cannot be imported "
                                 f"({type(exc).__name__}: {exc})") from None
            missing = missing_members("reward_function", target)
            if missing:
                raise self.error(path + ("name",), f"reward {name!r} is not callable")
        else:
            target = self._load("reward_function", name, path)
        label = name.rpartition(":")[2].rpartition(".")[2]
        self.check_installed(f"reward {name!r}", target, path)
        required = tuple(getattr(target, "required_columns", ()))
        if not inspect.isclass(target):
            if params:
                raise self.error(path + (sorted(params)[0],),
                                 f"reward {name!r} is a function and takes no options (got "
                                 f"{', '.join(sorted(params))}); write a class to take options")
            return RewardChoice(label, weight, target, required)
        config = self._validated(target, params, path)
        options = config.model_dump() if config is not None else dict(params)
        try:
            return RewardChoice(label, weight, target(**options), required)
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise self.error(path, f"reward {name!r}: bad options: {message}") from None

    def check_installed(self, what: str, target: Any, path: FieldPath) -> None:
        """The modules a target lists in ``requires`` import; else one error naming
        ``install``, the pip requirement that provides them."""
        from importlib.util import find_spec

        for module in getattr(target, "requires", ()):
            if find_spec(module) is None:
                install = getattr(target, "install", "") or module
                raise self.error(path + ("name",), f"{what} needs the {module!r} package, "
                                 f"which is not installed: pip install '{install}'")

    def _validated(self, target: Any, params: dict[str, Any], path: FieldPath
                   ) -> BaseModel | None:
        """The target's ``Config`` instance, or None after checking ``__init__``'s keywords."""
        config_model = _config_model(target)
        if config_model is not None:
            try:
                return config_model.model_validate(params)
            except ValidationError as exc:
                raise ConfigError(format_validation_error(exc, self.source, path)) from None
        unknown = _unknown_keywords(target, params)
        if unknown:
            raise self.error(path + (unknown[0],), f"unknown option; options: "
                             f"{', '.join(_keywords(target)) or 'none'}")
        return None


def plan_run(config: RunConfig, source: YamlSource | None = None,
             registry: Registry | None = None, base_dir: Path | None = None) -> RunPlan:
    """Resolve and cross-check ``config``; raises one ConfigError for the first mistake.

    ``base_dir`` resolves relative data paths (default: the current directory).
    """
    if registry is None:
        from astrai_core.plugins import process_registry

        registry = process_registry()
    resolve = Resolver(registry, source)
    strategy = resolve.section("strategy", config.strategy, ("strategy",))
    try:
        config, model_source, needs, advantage, policy_loss, rewards = _plan_training(
            resolve, config, strategy, Path.cwd() if base_dir is None else Path(base_dir))
    except FieldError as exc:
        raise resolve.error(exc.path, exc.message) from None
    sampler_section = config.sampler or ComponentSection(name=DEFAULT_SAMPLER)
    sampler = resolve.sampler(sampler_section, ("sampler",))
    try:
        online = strategy.config if isinstance(strategy.config, OnlineConfig) else None
        check_online_options(config, needs, online, world=launched_world_size(),
                             registry=registry, sampler=sampler.name, model_source=model_source)
        config = resolve_max_prompt_len(config, needs, sampler.options)
    except FieldError as exc:
        raise resolve.error(exc.path, exc.message) from None
    if model_source is not None and model_source.backend == TRANSFORMERS:
        _check_transformers_backend(resolve, config, sampler, needs, model_source)
    device = (None if config.device.name == "auto"
              else resolve.section("device_backend", config.device, ("device",)))
    environment, episode = _environment(resolve, config, needs)
    if (environment.name != DEFAULT_ENVIRONMENT and episode.max_turns > 1
            and launched_world_size() > 1
            and registry.get("sampler", sampler.name).asynchronous):
        # Such a sampler serves a distributed trainer's ranks in step, one request each;
        # the turns of multi-turn episodes differ in number from rank to rank.
        raise resolve.error(("environment",), f"multi-turn episodes with sampler "
                            f"{sampler.name!r} run on one trainer process only; use the "
                            "torch sampler in a distributed run, or one process")
    trackers = plan_trackers(resolve, config.trainer.report_to, Path(config.output_dir))
    return RunPlan(config=config, source=source, registry=registry, strategy=strategy,
                   needs=needs, advantage=advantage, sampler=sampler, rewards=rewards,
                   device=device, policy_loss=policy_loss, environment=environment,
                   episode=episode, trackers=trackers, model_source=model_source)


def _plan_training(resolve: Resolver, config: RunConfig, strategy: Component, base_dir: Path
                   ) -> tuple[RunConfig, ModelSource | None, StrategyNeeds, Component | None,
                              Component | None, tuple[RewardChoice, ...]]:
    """What the strategy trains on: the config (rows unpacked where the strategy needs it),
    the model's source, the strategy's needs, its advantage estimator and policy loss, the
    reward functions; then the strategy's own checks."""
    _check_paths(config, base_dir)
    model_source = _model_source(config, resolve.registry)
    needs = strategy.target.needs(strategy.config)
    config = _resolve_auto_formats(config, needs, base_dir)
    check_model_fit(config, model_source)  # the sizes of the formats the data turned out to be
    _check_data(config, strategy.name, needs)
    config = _unpack_rows(config, strategy.name, needs)
    advantage = _advantage(resolve, config, strategy, needs)
    policy_loss = (None if needs.policy_loss is None else resolve.component(
        needs.policy_loss.kind, needs.policy_loss.name, needs.policy_loss.params,
        needs.policy_loss.path))
    rewards = tuple(resolve.reward(entry.name, entry.weight, entry.params, ("rewards", i))
                    for i, entry in enumerate(config.rewards))
    _check_rewards(config, needs, rewards, _environment_rewards(resolve, config))
    strategy.target.check_run(strategy.config, config)
    check_parallel(config, launched_world_size())
    check_context_parallel(config, needs, model_source, launched_world_size())
    return config, model_source, needs, advantage, policy_loss, rewards


def _model_source(config: RunConfig, registry: Registry) -> ModelSource | None:
    """``model.path`` resolved (None: a from-scratch model)."""
    return (None if config.model.path is None else
            describe(config.model.path, config.model.backend, registry,
                     config.model.trust_remote_code))


# The samplers that generate with a transformers-backend policy (docs/models.md).
TRANSFORMERS_SAMPLERS = ("torch", "ray", "vllm")


def _check_transformers_backend(resolve: Resolver, config: RunConfig, sampler: Component,
                                needs: StrategyNeeds, source: ModelSource) -> None:
    """What the transformers backend does not offer is refused before any work, naming
    the model type (its router: :func:`astrai_core.config.online.check_router_replay`)."""
    model_type, backend = source.model_type, "the transformers backend"
    generates = needs.rollouts or needs.generates or any(
        e.format == "prompt" for _, e in config.data.named_evals())
    if not generates:
        return
    # The ray sampler's workers hold a copy of the transformers model; their own sampler
    # must be one that generates with it (torch).
    inner = (sampler.options.get("worker_sampler") or {"name": "torch"}
             if sampler.name == "ray" else None)
    if sampler.name not in TRANSFORMERS_SAMPLERS:
        raise resolve.error(("sampler", "name"), f"sampler {sampler.name!r} cannot take the "
                            f"weights of model_type {model_type!r} on {backend} yet; use "
                            "the torch, vllm or ray sampler")
    if inner is not None and inner.get("name", "torch") != "torch":
        raise resolve.error(("sampler", "worker_sampler", "name"),
                            f"worker sampler {inner.get('name')!r} cannot take the weights of "
                            f"model_type {model_type!r} on {backend} yet; use torch")


def plan_trackers(resolve: Resolver, entries: list[Any],
                  output_dir: Path | None = None) -> tuple[Component, ...]:
    """``trainer.report_to``: each tracker loaded with its options, its backend installed,
    and (given the run's ``output_dir``) its own ``check`` passed: its store can be opened."""
    trackers = []
    for index, entry in enumerate(entries):
        path: FieldPath = ("trainer", "report_to", index)
        if entry.name in {t.name for t in trackers}:
            raise resolve.error(path + ("name",), f"tracker {entry.name!r} is listed twice")
        tracker = resolve.component("tracker", entry.name, entry.params, path)
        resolve.check_installed(f"tracker {entry.name!r}", tracker.target, path)
        check = getattr(tracker.target, "check", None)
        if output_dir is not None and check is not None:
            try:
                tracker.target(**tracker.options).check(output_dir)
            except ValueError as exc:
                raise resolve.error(path, f"tracker {entry.name!r}: {exc}") from None
        trackers.append(tracker)
    return tuple(trackers)


def _environment(resolve: Resolver, config: RunConfig, needs: StrategyNeeds
                 ) -> tuple[Component, EpisodeConfig]:
    """The ``environment:`` section: its episode keys and the environment's own options."""
    section = config.environment or ComponentSection(name=DEFAULT_ENVIRONMENT)
    path: FieldPath = ("environment",)
    generates = needs.rollouts or any(e.format == "prompt" for _, e in config.data.named_evals())
    if config.environment is not None and not generates:
        raise resolve.error(path, "this run neither draws rollouts nor evaluates by "
                            "generation, so an environment has nothing to do")
    episode_keys, options = EpisodeConfig.split(section.params)
    try:
        episode = EpisodeConfig.model_validate(episode_keys)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, resolve.source, path)) from None
    return resolve.component("environment", section.name, options, path), episode


def _check_paths(config: RunConfig, base_dir: Path) -> None:
    """Every directory and file the run reads exists."""
    data = config.data.resolve_paths(base_dir)
    files = [(("data", "sources", i, "path"), s.path) for i, s in enumerate(data.sources)]
    files += [(where + ("path",), s.path) for where, s in _eval_fields(data)]
    for path, file in files:
        if isinstance(file, str):  # hf://NAME: found (or not) when the data is loaded
            continue
        if not file.is_file() and not (file / "state.json").is_file() \
                and not (file / "dataset_dict.json").is_file():
            what = "is a directory, but not one written by datasets' save_to_disk" \
                if file.is_dir() else "not found"
            raise FieldError(path, f"data file {what}: {file}")
    model = config.model  # model.path: model_source.describe
    if model.tokenizer is not None and not Path(model.tokenizer).is_dir():
        raise FieldError(("model", "tokenizer"),
                         f"tokenizer directory {model.tokenizer!r} does not exist")
    if model.lora is not None and model.lora.path is not None:
        _check_adapter_dir(model.lora)


def _check_adapter_dir(lora: Any) -> None:
    """``model.lora.path`` is a PEFT LoRA adapter; its own r/alpha/targets apply, so
    options that contradict them are refused rather than silently ignored."""
    import json

    where = ("model", "lora", "path")
    config_file = Path(lora.path) / "adapter_config.json"
    if not config_file.is_file():
        raise FieldError(where, f"{config_file} not found: not a PEFT adapter directory")
    try:
        saved = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FieldError(where, f"{config_file} is not valid JSON: {exc}") from None
    if saved.get("peft_type") != "LORA":
        raise FieldError(where, f"{config_file} is a {saved.get('peft_type')!r} adapter, not LORA")
    spellings = {"r": "r", "alpha": "lora_alpha", "dropout": "lora_dropout",
                 "use_rslora": "use_rslora", "use_dora": "use_dora"}
    for field in sorted(lora.model_fields_set & spellings.keys()):
        if saved.get(spellings[field]) != getattr(lora, field):
            raise FieldError(("model", "lora", field),
                             f"{getattr(lora, field)!r} contradicts the adapter at "
                             f"model.lora.path ({spellings[field]}={saved.get(spellings[field])!r})")


def _resolve_auto_formats(config: RunConfig, needs: StrategyNeeds,
                          base_dir: Path | None) -> RunConfig:
    """``format: auto`` sources given the format their columns show, among those the
    strategy reads (training) or evaluates (generation from prompts, or its own loss)."""
    from astrai_core.data.auto_format import resolve_auto

    evaluation = ("prompt",) if needs.rollouts else (*needs.data_formats, "prompt")
    data = resolve_auto(config.data, needs.data_formats, evaluation, base_dir)
    return config if data is config.data else config.model_copy(update={"data": data})


def _check_data(config: RunConfig, strategy: str, needs: StrategyNeeds) -> None:
    formats = needs.data_formats
    for index, source in enumerate(config.data.sources):
        if source.format not in formats:
            raise FieldError(("data", "sources", index, "format"),
                             f"strategy {strategy!r} trains on {' or '.join(formats)} data, "
                             f"not {source.format!r}")
    kinds = {BATCH_KIND[f] for f in formats}
    for where, evaluation in _eval_fields(config.data):
        if evaluation.format == "prompt":
            continue  # prompt data is evaluated by generation, whatever the strategy
        if needs.rollouts or BATCH_KIND[evaluation.format] not in kinds:
            allowed = ["prompt"] if needs.rollouts else sorted({"prompt", *formats})
            raise FieldError(where + ("format",),
                             f"strategy {strategy!r} evaluates {' or '.join(allowed)} data, not "
                             f"{evaluation.format!r} (its loss cannot be taken on those batches)")


def _unpack_rows(config: RunConfig, strategy: str, needs: StrategyNeeds) -> RunConfig:
    """``data.pack`` off for a strategy that needs one example per row, unless the config
    sets it true itself (then one error: the two cannot both hold)."""
    if needs.unpacked_rows is None or not config.data.pack:
        return config
    if "pack" in config.data.model_fields_set:
        raise FieldError(("data", "pack"), f"strategy {strategy!r} {needs.unpacked_rows}, so "
                         "each row must hold one example: remove data.pack (rows are then "
                         "unpacked) or set it false")
    return config.model_copy(update={"data": config.data.model_copy(update={"pack": False})})


def _eval_fields(data: Any) -> list[tuple[FieldPath, Any]]:
    """(field path, source) of ``data.eval`` and each of ``data.eval_sets``."""
    found: list[tuple[FieldPath, Any]] = []
    if data.eval is not None:
        found.append((("data", "eval"), data.eval))
    found += [(("data", "eval_sets", i), s) for i, s in enumerate(data.eval_sets)]
    return found


def _advantage(resolve: Resolver, config: RunConfig, strategy: Component,
               needs: StrategyNeeds) -> Component | None:
    if not needs.advantage:
        return None
    if config.advantage is not None:
        advantage = resolve.section("advantage_estimator", config.advantage, ("advantage",))
        path: FieldPath = ("advantage", "name")
    else:
        default = resolve.registry.get("strategy", strategy.name).default_advantage
        if default is None:
            raise FieldError(("strategy", "name"), f"strategy {strategy.name!r} needs an "
                             "`advantage: {name: ...}` section")
        if not resolve.registry.has("advantage_estimator", default):
            raise FieldError(("strategy", "name"), f"{strategy.name!r} needs the advantage "
                             f"estimator {default!r} (its default; an `advantage:` section can "
                             f"choose another): "
                             f"{resolve.registry.unknown_message('advantage_estimator', default)}")
        advantage = resolve.component("advantage_estimator", default, {}, ("advantage",))
        path = ("strategy", "name")
    if getattr(advantage.target, "needs_values", False) and not needs.values:
        raise FieldError(path, f"advantage estimator {advantage.name!r} needs a value critic, "
                         f"which strategy {strategy.name!r} does not train; use ppo, or an "
                         "estimator without values (grpo, rloo)")
    return advantage


def _environment_rewards(resolve: Resolver, config: RunConfig) -> bool:
    """Whether the environment scores every episode itself (``rewards_episodes``), so that an
    online run needs no reward function."""
    if config.environment is None or not resolve.registry.has("environment", config.environment.name):
        return False
    spec = resolve.registry.get("environment", config.environment.name)
    return bool(getattr(spec.load(), "rewards_episodes", False))


def _check_rewards(config: RunConfig, needs: StrategyNeeds, rewards: tuple[RewardChoice, ...],
                   environment_rewards: bool = False) -> None:
    if needs.rollouts and not rewards and not environment_rewards:
        raise FieldError(("rewards",), "an online strategy needs at least one reward function "
                         "(or an environment that scores its episodes)")
    for index, reward in enumerate(rewards):
        required = reward.required_columns
        for number, source in enumerate(config.data.sources):
            if not isinstance(source.columns, list) or source.format != "prompt":
                continue
            absent = [c for c in required if c not in source.columns]
            if absent:
                raise FieldError(("rewards", index, "name"),
                                 f"reward {reward.label!r} needs column(s) {', '.join(absent)}, "
                                 f"which data.sources.{number} ({source.path}) does not "
                                 "declare in its `columns`")


def _config_model(target: Any) -> type[BaseModel] | None:
    """The target's options model (its ``Config``), if it declares one."""
    config_model = getattr(target, "Config", None)
    if isinstance(config_model, type) and issubclass(config_model, BaseModel):
        return config_model
    return None


def _split_sampling(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the SamplingParams fields of a sampler section's ``options``, the others)."""
    from astrai_core.sampling.params import SamplingParams

    known = set(SamplingParams.model_fields)
    return ({k: v for k, v in options.items() if k in known},
            {k: v for k, v in options.items() if k not in known})


def _keywords(target: Any) -> list[str]:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [n for n, p in signature.parameters.items()
            if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _unknown_keywords(target: Any, params: dict[str, Any]) -> list[str]:
    if not params or not callable(target):
        return []
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return []
    return sorted(set(params) - set(_keywords(target)))
