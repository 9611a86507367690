"""What a sampler declares about itself beyond ``generate`` and ``update_weights``.

A sampler class states its capabilities once, as a class attribute
``capabilities = SamplerCapabilities(...)`` (an instance may set its own in ``__init__``
when one depends on its options: the ray sampler is interruptible when its workers'
sampler is). The core reads the record once, when it builds the sampler, and hands it to
the parts that act on it; it never inspects the sampler's attributes or signatures to
guess them. A sampler that declares nothing gets :data:`NO_CAPABILITIES`: it is called
through ``generate(prompt_ids, params)`` and ``update_weights(state_dict)`` only.

``asynchronous`` and ``reports_routing`` are not here: they are fields of the sampler's
``SamplerSpec``, because the run plan decides with them before any sampler is built.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SamplerCapabilities:
    """A sampler's declared capabilities; every one defaults to ``False``."""

    interruptible: bool = False
    """``generate`` takes ``interrupt`` (a ``threading.Event``): once it is set, the call
    ends after its current decode step and its unfinished completions come back as they
    stand (``finish_reason="abort"``). An asynchronous sampler's ``generate_async`` takes
    ``interruptible=True`` instead: the next ``update_weights`` may then cut it short."""

    owns_weights: bool = False
    """It generates from its own copy of the weights (an inference engine's), never from
    the trainer's parameters: a sharded trainer does not gather the policy around its
    ``generate`` calls; new weights reach it through ``update_weights`` only."""

    shares_policy: bool = False
    """It keeps the ``model=`` module it was built with and reads new weights from it:
    after an optimizer step changed that module in place, the core calls
    ``update_weights()`` with no state dict. Otherwise every publish hands it the policy's
    whole state dict (a LoRA policy's merged)."""

    reports_metrics: bool = False
    """It has ``metrics() -> dict[str, float]``: the run logs them with every optimizer
    step (e.g. weight-push times)."""

    images: bool = False
    """``generate`` (and ``generate_async``) take ``images=``: per prompt, a
    vision-language model's image inputs (the processor's output for that prompt alone,
    by name) or None, and sample each prompt conditioned on its images."""

    adapters: bool = False
    """It serves peft LoRA adapters on the base it was built with: built with
    ``max_adapters=N`` (adapters held at once) and ``max_adapter_rank=R``, its ``generate``
    takes ``adapter=``, a peft adapter directory (None: the bare base). Its log-probs for
    filtered requests come from the ``model=`` module's forward, so that module must then
    compute the same adapter (``astrai tinker`` activates it there)."""

    needs_close: bool = False
    """It has ``close()``, called once when the run (or ``astrai eval``) ends, on an
    error too: it holds processes or files to let go of (workers, an engine)."""


NO_CAPABILITIES = SamplerCapabilities()

# The method each capability promises, checked when the sampler's spec is loaded.
PROMISED_MEMBERS = {"reports_metrics": "metrics", "needs_close": "close"}


def sampler_capabilities(sampler: Any) -> SamplerCapabilities:
    """The record ``sampler`` (a class or a built instance) declares as ``capabilities``;
    :data:`NO_CAPABILITIES` when it declares none. A TypeError names the class when the
    attribute is something else."""
    declared = getattr(sampler, "capabilities", NO_CAPABILITIES)
    if not isinstance(declared, SamplerCapabilities):
        owner = sampler if isinstance(sampler, type) else type(sampler)
        raise TypeError(f"{owner.__module__}.{owner.__qualname__}.capabilities must be a "
                        f"SamplerCapabilities record, got {type(declared).__name__}")
    return declared


def unkept_promises(sampler: Any) -> list[str]:
    """What ``sampler``'s declared capabilities promise and it lacks: the bad record
    itself, or the methods they name (``metrics``, ``close``)."""
    try:
        declared = sampler_capabilities(sampler)
    except TypeError:
        return ["capabilities (a SamplerCapabilities record)"]
    return [member for field in fields(declared) if getattr(declared, field.name)
            and (member := PROMISED_MEMBERS.get(field.name)) and not hasattr(sampler, member)]
