"""Samplers for the ray sampler's tests, loaded as a plugin (ASTRAI_PLUGINS) by the test
process and by every Ray worker: a torch sampler that is deliberately slow (per call, or
per token, the latter interruptible as the torch sampler is), and one whose process dies
at a given generate call; two whose generate takes the interrupt and any keyword and
names those it got, one declared interruptible and one not; and a device backend that
is never available."""

from __future__ import annotations

import dataclasses
import os
import time

from astrai_core import DeviceBackendSpec, SamplerSpec, hookimpl
from astrai_core.sampling.torch_sampler import TorchSampler

# the torch sampler's capabilities but for the interrupt, which these generates do not take
UNINTERRUPTIBLE = dataclasses.replace(TorchSampler.capabilities, interruptible=False)


@hookimpl
def astrai_samplers():
    return [SamplerSpec(name="slow_torch", target="ray_test_samplers:SlowTorchSampler",
                        summary="the torch sampler, delay_s slower per generate call"),
            SamplerSpec(name="slow_step_torch", target="ray_test_samplers:SlowStepTorchSampler",
                        summary="the torch sampler, token_delay_s slower per token"),
            SamplerSpec(name="dying_torch", target="ray_test_samplers:DyingTorchSampler",
                        summary="the torch sampler, whose process exits at call die_at_call"),
            SamplerSpec(name="keyword_torch", target="ray_test_samplers:KeywordTorchSampler",
                        summary="the torch sampler, naming the keywords generate got"),
            SamplerSpec(name="interruptible_keyword_torch",
                        target="ray_test_samplers:InterruptibleKeywordTorchSampler",
                        summary="keyword_torch, declared interruptible")]


@hookimpl
def astrai_device_backends():
    return [DeviceBackendSpec(name="absent_device", target="astrai_core.devices.cpu:CpuBackend",
                              summary="a device no machine has: a worker on it cannot start",
                              available="ray_test_samplers:absent_device_available")]


def absent_device_available() -> bool:
    return False


class SlowTorchSampler(TorchSampler):
    capabilities = UNINTERRUPTIBLE

    class Config(TorchSampler.Config):
        delay_s: float = 0.0

    def __init__(self, model, tokenizer=None, delay_s: float = 0.0, **engine):
        super().__init__(model, tokenizer, **engine)
        self.delay_s = delay_s

    def generate(self, prompts, params, on_token=None):
        time.sleep(self.delay_s)  # slower than a training step: sampling is the bottleneck
        return super().generate(prompts, params, on_token)


class SlowStepTorchSampler(TorchSampler):
    class Config(TorchSampler.Config):
        token_delay_s: float = 0.0

    def __init__(self, model, tokenizer=None, token_delay_s: float = 0.0, **engine):
        super().__init__(model, tokenizer, **engine)
        self.token_delay_s = token_delay_s

    def generate(self, prompts, params, on_token=None, record_routing=False, interrupt=None):
        def slowly(index, token):  # long decoding, so that a weight push finds it running
            time.sleep(self.token_delay_s)
            if on_token is not None:
                on_token(index, token)

        return super().generate(prompts, params, slowly, record_routing, interrupt)


class DyingTorchSampler(TorchSampler):
    capabilities = UNINTERRUPTIBLE

    class Config(TorchSampler.Config):
        die_at_call: int = 1

    def __init__(self, model, tokenizer=None, die_at_call: int = 1, **engine):
        super().__init__(model, tokenizer, **engine)
        self.die_at_call = die_at_call
        self.calls = 0

    def generate(self, prompts, params, on_token=None):
        self.calls += 1
        if self.calls == self.die_at_call:
            os._exit(1)  # the worker's process dies, as when it is killed or its node fails
        return super().generate(prompts, params, on_token)


class KeywordTorchSampler(TorchSampler):
    """``generate`` takes ``interrupt`` and any keyword, and names those it got in each
    completion's text; it declares no ``interruptible``, so a worker must never pass it
    the interrupt, whatever its signature."""

    capabilities = UNINTERRUPTIBLE

    def generate(self, prompts, params, interrupt=None, **keywords):
        got = sorted([*keywords, *(["interrupt"] if interrupt is not None else [])])
        completions = super().generate(prompts, params, interrupt=interrupt)
        for completion in completions:
            completion.text = ",".join(got)
        return completions


class InterruptibleKeywordTorchSampler(KeywordTorchSampler):
    capabilities = TorchSampler.capabilities
