"""The ``sampler: {name: ray, ...}`` section, checked whole by the run plan.

``worker_sampler`` names the sampler each worker runs (found through the registry) with
its engine options, validated here against that sampler's own ``Config``. Sampling
fields written inside it (``max_new_tokens``, ``temperature``, ...) are the rollouts'
defaults, exactly as if they were written in the ``sampler:`` section itself.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from astrai_core.api import SamplingParams

SAMPLING_FIELDS = frozenset(SamplingParams.model_fields)


class RaySamplerConfig(SamplingParams):
    """Default SamplingParams plus where and how the rollout workers run."""

    workers: int = Field(1, ge=1, description="rollout workers (Ray actors)")
    worker_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0},
        description="Ray resources of one worker, one placement-group bundle each "
        "({CPU: 1}, {GPU: 1}, {NPU: 1}, ...)")
    worker_sampler: dict[str, Any] = Field(
        default_factory=lambda: {"name": "torch"},
        description="{name: torch | vllm | ..., engine options}: the sampler each worker runs")
    worker_device: str = Field("auto", description="device backend of the workers' models "
                               "(auto: the best one each worker sees)")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the workers' bundles")
    address: str | None = Field(None, description="Ray cluster to join (default: "
                                "RAY_ADDRESS, else a local Ray started for the run)")
    init_kwargs: dict[str, Any] = Field(default_factory=dict,
                                        description="more ray.init keyword arguments")
    weight_transport: Literal["auto", "collective", "object_store"] = Field(
        "auto", description="collective: a torch.distributed group trainer+workers; "
        "object_store: Ray's; auto: collective where a group can be formed")
    push: Literal["full", "delta"] = Field(
        "full", description="full: every pushed tensor, every push; delta: only the values "
        "that changed since the last push, each updated tensor checked by digest on arrival")
    bucket_mb: float = Field(256.0, gt=0, description="size bound of one weight bucket (MiB)")
    timeout_s: float = Field(600.0, gt=0, description="bound on starting the workers, "
                             "forming the group and one weight push")

    @model_validator(mode="before")
    @classmethod
    def _lift_sampling_fields(cls, data: Any) -> Any:
        """Sampling fields inside ``worker_sampler`` are the section's own."""
        if not isinstance(data, dict) or not isinstance(data.get("worker_sampler"), dict):
            return data
        data, inner = dict(data), dict(data["worker_sampler"])
        for key in sorted(SAMPLING_FIELDS & set(inner)):
            value = inner.pop(key)
            if key in data and data[key] != value:
                raise ValueError(f"{key} is given both in sampler ({data[key]!r}) and in "
                                 f"sampler.worker_sampler ({value!r}); give it once")
            data[key] = value
        data["worker_sampler"] = inner
        return data

    @field_validator("worker_sampler")
    @classmethod
    def _check_worker_sampler(cls, section: dict[str, Any]) -> dict[str, Any]:
        name = section.get("name")
        if not isinstance(name, str):
            raise ValueError("needs a name (torch, vllm, ...)")
        if name == "ray":
            raise ValueError("cannot be ray itself; name the sampler each worker runs "
                             "(torch, vllm, ...)")
        engine_options(name, section)  # unknown name or bad options: raises
        return section

    @field_validator("worker_resources")
    @classmethod
    def _positive(cls, resources: dict[str, float]) -> dict[str, float]:
        if not resources or any(v <= 0 for v in resources.values()):
            raise ValueError("give each worker's resources as positive amounts, e.g. {CPU: 1}")
        return resources


def engine_options(name: str, section: dict[str, Any]) -> dict[str, Any]:
    """The worker sampler's constructor options from its section, validated against its
    ``Config`` when it has one (its sampling fields are the ray section's business)."""
    from astrai_core.api import PluginError, process_registry

    try:
        target = process_registry().load("sampler", name)
    except PluginError as exc:
        raise ValueError(str(exc)) from None
    options = {k: v for k, v in section.items() if k != "name"}
    config = getattr(target, "Config", None)
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        return options
    try:
        validated = config.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ValueError(f"{where}: {error['msg']}") from None
    return {k: v for k, v in validated.model_dump().items() if k not in SAMPLING_FIELDS}
