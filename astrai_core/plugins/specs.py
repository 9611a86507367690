"""Typed records that plugins return from their hooks.

A spec names a component and points at it (``target = "module.path:attribute"``)
without importing it: the target is imported only by :meth:`Spec.load`, so listing
plugins stays fast and never imports torch.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def import_target(target: str) -> Any:
    """Import ``"module.path:attr.sub"`` and return the attribute."""
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _checked_target(value: str) -> str:
    if not _TARGET.match(value):
        raise ValueError(f"target {value!r} must look like 'package.module:attribute'")
    return value


def _load(target: str, label: str) -> Any:
    """``target`` imported; a PluginError naming ``label`` when it cannot be."""
    from astrai_core.errors import PluginError

    try:
        return import_target(target)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure
        raise PluginError(f"{label} cannot be loaded ({type(exc).__name__}: {exc})") from exc


class Spec(BaseModel):
    """Common fields of every component record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str] = ""

    name: str = Field(description="lower-case, unique within its kind")
    target: str = Field(description='"module.path:attribute", imported only by load()')
    summary: str = Field(description="one line shown by `astrai list-plugins`")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"spec name {value!r} must be lower-case letters, digits, '_' or '-', "
                "starting with a letter"
            )
        return value

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        return _checked_target(value)

    @field_validator("summary")
    @classmethod
    def _check_summary(cls, value: str) -> str:
        if "\n" in value.strip():
            raise ValueError("summary must be a single line")
        return value.strip()

    def load(self) -> Any:
        """Import and return the target, checked against its kind's Protocol.

        Raises PluginError naming the target when it does not import, lacks its
        attribute, or lacks a member the core calls (see
        :mod:`astrai_core.plugins.protocols`).
        """
        from astrai_core.errors import PluginError
        from astrai_core.plugins.protocols import missing_members

        label = f"{self.kind.replace('_', ' ')} {self.name!r}: target {self.target!r}"
        target = _load(self.target, label)
        missing = missing_members(self.kind, target)
        if missing:
            raise PluginError(f"{label} lacks {', '.join(missing)} (see "
                              "astrai_core.plugins.protocols; extend the base classes of "
                              "astrai_core.api)")
        return target


class StrategySpec(Spec):
    """A training strategy: owns the loss (seq, sft, dpo, grpo, ppo, ...)."""

    kind: ClassVar[str] = "strategy"
    default_advantage: str | None = Field(
        default=None,
        description="advantage estimator an online strategy uses when the config has no "
        "`advantage` section (the run plan reads it)",
    )
    exporter: str | None = Field(
        default=None,
        description='"module.path:function" that exports the strategy\'s checkpoints to a '
        "Hugging Face directory when they are more than a causal LM (`astrai export` calls "
        "it as fn(src, dst, model_type=..., importer=...) -> the directory)",
    )

    @field_validator("exporter")
    @classmethod
    def _check_exporter(cls, value: str | None) -> str | None:
        return None if value is None else _checked_target(value)

    def load_exporter(self) -> Any:
        """The ``exporter`` function, imported; None when the strategy has none."""
        if self.exporter is None:
            return None
        return _load(self.exporter, f"strategy {self.name!r}: exporter {self.exporter!r}")


class AdvantageEstimatorSpec(Spec):
    """Credit assignment for online strategies (grpo, gae, rloo, ...)."""

    kind: ClassVar[str] = "advantage_estimator"


class SamplerSpec(Spec):
    """A generation engine behind the sampler contract (torch, vllm, ...)."""

    kind: ClassVar[str] = "sampler"
    asynchronous: bool = Field(
        default=False,
        description="generates apart from the trainer's process and has generate_async(), so "
        "rollouts may overlap training (`rollout.max_staleness` > 0)",
    )
    reports_routing: bool = Field(
        default=False, description="records each token's MoE experts while sampling "
        "(what `router_replay: R3` replays)")

    def load(self) -> Any:
        """The sampler class, checked against ``SamplerProtocol``; an ``asynchronous``
        one must also have ``generate_async``."""
        target = super().load()
        if self.asynchronous and not hasattr(target, "generate_async"):
            from astrai_core.errors import PluginError

            raise PluginError(f"sampler {self.name!r}: target {self.target!r} lacks "
                              "generate_async, which its spec's asynchronous=True promises")
        return target


class ModelImporterSpec(Spec):
    """Maps Hugging Face checkpoints of some ``model_type``s to native ones and back."""

    kind: ClassVar[str] = "model_importer"
    model_types: tuple[str, ...] = Field(
        default=(), description="Hugging Face config.json `model_type` values handled"
    )


class DeviceBackendSpec(Spec):
    """A device family (cpu, cuda, npu, ...)."""

    kind: ClassVar[str] = "device_backend"
    available: str | None = Field(
        default=None,
        description='"module:function" returning True when this device can be used; '
        "None means always available",
    )
    priority: int = Field(default=0, description="higher wins when `device: {name: auto}`")

    def is_available(self) -> bool:
        """Ask the backend's probe, without loading the backend itself."""
        if self.available is None:
            return True
        try:
            return bool(import_target(self.available)())
        except Exception:  # a probe that cannot even import means "not here"
            return False


class RewardFunctionSpec(Spec):
    """A reward ``f(prompts, completions, **columns) -> list[float]``."""

    kind: ClassVar[str] = "reward_function"


class PolicyLossSpec(Spec):
    """A policy loss ``loss(logprobs=, old_logprobs=, advantages=, response_mask=, **extras)
    -> (per_token_loss, metrics)`` for online strategies (ppo_clip, gspo, cispo, ...)."""

    kind: ClassVar[str] = "policy_loss"


class EnvironmentSpec(Spec):
    """An environment for multi-turn rollouts: a class built from the ``environment:``
    section's options, with ``reset(row) -> state`` and ``step(state, turn) -> EnvStep``
    (single_turn, tools, ...)."""

    kind: ClassVar[str] = "environment"


class TrackerSpec(Spec):
    """An experiment tracker that `trainer.report_to` sends the run's config and metrics to
    (tensorboard, wandb, mlflow, trackio, ...)."""

    kind: ClassVar[str] = "tracker"


SPEC_CLASSES: dict[str, type[Spec]] = {
    cls.kind: cls
    for cls in (
        StrategySpec,
        AdvantageEstimatorSpec,
        SamplerSpec,
        ModelImporterSpec,
        DeviceBackendSpec,
        RewardFunctionSpec,
        PolicyLossSpec,
        EnvironmentSpec,
        TrackerSpec,
    )
}
KINDS: tuple[str, ...] = tuple(SPEC_CLASSES)
