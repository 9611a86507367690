"""Who generates for the Tinker engine's ``sample``: astrai's torch sampler, or a sampler
from the registry that serves LoRA adapters itself (``astrai tinker --sampler vllm``).

:meth:`TorchEngine.sample <astrai_core.tinker.engine.TorchEngine.sample>` checks the
request, loads the saved adapter into its sampling slot and makes it the one in effect on
the base, then asks its backend for the completions. The torch backend samples the base
module as it stands. A registry sampler (capability ``adapters``) holds one engine per base
and is given the adapter's peft directory (its LM-head LoRA included); the base module
with the adapter in effect is still what it recomputes filtered requests' log-probs with,
and what the engine computes prompt log-probs with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from astrai_core.errors import AstraiError
from astrai_core.log import get_logger
from astrai_core.sampling.params import SamplingParams
from astrai_core.tinker.bases import LoadedBase
from astrai_core.tinker.engine_types import SampledOut

log = get_logger(__name__)
# the sampler's arguments astrai tinker sets itself
SET_BY_TINKER = ("model", "tokenizer", "max_adapters", "max_adapter_rank")


class SampleBackend(Protocol):
    def generate(self, base: LoadedBase, adapter: Path | None, prompt: list[int],
                 params: SamplingParams, tokenizer: Any) -> list[SampledOut]:
        """``params.n`` completions of ``prompt`` on ``base`` with the adapter saved as
        peft files in ``adapter`` (None: the bare base), which is also the one in effect
        on ``base.model``."""
        ...

    def close(self) -> None: ...


class TorchBackend:
    """astrai's torch sampler on the base module (the default)."""

    def generate(self, base: LoadedBase, adapter: Path | None, prompt: list[int],
                 params: SamplingParams, tokenizer: Any) -> list[SampledOut]:
        from astrai_core.tinker.sampling import generate

        return generate(base, prompt, params, tokenizer)

    def close(self) -> None:
        pass


class RegistryBackend:
    """A registry sampler that serves peft adapters, one instance per base; see the module
    docstring."""

    def __init__(self, samplers: dict[str, Any]) -> None:
        self.samplers = samplers  # by base name

    def generate(self, base: LoadedBase, adapter: Path | None, prompt: list[int],
                 params: SamplingParams, tokenizer: Any) -> list[SampledOut]:
        from astrai_core.tinker.sampling import sampled_outs

        return sampled_outs(self.samplers[base.facts.name].generate([prompt], params,
                                                                    adapter=adapter))

    def close(self) -> None:
        for sampler in self.samplers.values():
            sampler.close()


def registry_backend(name: str, bases: list[LoadedBase], max_adapters: int,
                     options: dict[str, Any] | None = None, registry: Any = None
                     ) -> RegistryBackend:
    """The ``--sampler name`` backend: one sampler per base, serving up to ``max_adapters``
    adapters of the base's largest LoRA rank; ``options``: more sampler keyword arguments.
    Build it before any tenant exists (the sampler starts on the bare base's weights)."""
    sampler_class = adapter_sampler(name, options or {}, registry)
    samplers: dict[str, Any] = {}
    try:
        for base in bases:
            log.info("starting the sampler", sampler=name, base=base.facts.name)
            samplers[base.facts.name] = sampler_class(
                model=base.model, tokenizer=_tokenizer_or_none(base), max_adapters=max_adapters,
                max_adapter_rank=base.facts.max_lora_rank, **(options or {}))
    except BaseException:
        RegistryBackend(samplers).close()  # the engines started so far
        raise
    return RegistryBackend(samplers)


def adapter_sampler(name: str, options: dict[str, Any], registry: Any = None) -> Any:
    """The sampler class ``name`` of the registry, checked to serve adapters and to take
    ``options`` (an AstraiError of one line otherwise)."""
    from astrai_core.plugins import process_registry
    from astrai_core.plugins.sampler_capabilities import sampler_capabilities

    registry = registry or process_registry()
    sampler_class = registry.load("sampler", name)  # unavailable: the registry's message
    if not sampler_capabilities(sampler_class).adapters:
        raise AstraiError(f"--sampler {name}: it does not serve LoRA adapters; use torch")
    check_options(name, sampler_class, options)
    return sampler_class


def check_options(name: str, sampler_class: Any, options: dict[str, Any]) -> None:
    """One line naming an option the sampler does not take (or one astrai sets itself)."""
    import inspect

    taken = inspect.signature(sampler_class).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values()):
        return
    offered = sorted(set(taken) - set(SET_BY_TINKER))
    for key in options:
        if key not in offered:
            raise AstraiError(f"--sampler-option {key}: the {name} sampler takes none of that "
                              f"name here; it takes: {', '.join(offered)}")


def _tokenizer_or_none(base: LoadedBase) -> Any:
    """The base's tokenizer, for stop strings (a base without one samples without them)."""
    from astrai_core.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(base.facts.tokenizer_path)
    except (AstraiError, OSError, ValueError):
        return None
