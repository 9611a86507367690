"""The sampler capability record: its defaults, how a class declares it, and the checks a
sampler spec's load makes of what the declaration promises."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from astrai_core import SamplerSpec
from astrai_core.api import NO_CAPABILITIES, SamplerCapabilities, sampler_capabilities
from astrai_core.errors import PluginError
from astrai_core.plugins.protocols import SamplerProtocol, protocol_members

CAPABILITIES = ("interruptible", "owns_weights", "shares_policy", "reports_metrics",
                "images", "adapters", "needs_close")


class Minimal:
    """Only what the contract requires."""

    def __init__(self, model=None, tokenizer=None):
        self.model = model

    def generate(self, prompt_ids, params):
        return []

    def update_weights(self, state_dict=None):
        return 1


def test_every_capability_defaults_to_false_and_the_record_is_frozen():
    assert [f.name for f in dataclasses.fields(SamplerCapabilities)] == list(CAPABILITIES)
    assert all(getattr(SamplerCapabilities(), name) is False for name in CAPABILITIES)
    assert NO_CAPABILITIES == SamplerCapabilities()
    with pytest.raises(dataclasses.FrozenInstanceError):
        NO_CAPABILITIES.interruptible = True  # type: ignore[misc]


def test_a_sampler_declaring_nothing_gets_the_defaults_whatever_methods_it_has():
    class WithExtras(Minimal):  # has close/metrics/interrupt, declares none of them
        def generate(self, prompt_ids, params, interrupt=None, **kwargs):
            return []

        def close(self):
            pass

        def metrics(self):
            return {}

    for sampler in (Minimal, Minimal(), WithExtras, WithExtras()):
        assert sampler_capabilities(sampler) is NO_CAPABILITIES


def test_the_built_in_torch_sampler_declares_what_it_does():
    from astrai_core.sampling.torch_sampler import TorchSampler

    assert sampler_capabilities(TorchSampler) == SamplerCapabilities(interruptible=True,
                                                                     shares_policy=True,
                                                                     images=True)


def test_an_instance_may_refine_its_class_record():
    class Refined(Minimal):
        capabilities = SamplerCapabilities(needs_close=True)

        def __init__(self, model=None, tokenizer=None):
            super().__init__(model, tokenizer)
            self.capabilities = dataclasses.replace(Refined.capabilities, interruptible=True)

        def close(self):
            pass

    assert not sampler_capabilities(Refined).interruptible
    assert sampler_capabilities(Refined()) == SamplerCapabilities(interruptible=True,
                                                                  needs_close=True)


def test_a_capabilities_attribute_of_another_type_is_named():
    class Wrong(Minimal):
        capabilities = {"interruptible": True}

    with pytest.raises(TypeError, match=r"Wrong\.capabilities must be a SamplerCapabilities"):
        sampler_capabilities(Wrong)


def test_the_protocol_declares_every_capability_and_its_optional_methods():
    members = protocol_members(SamplerProtocol)
    assert {"generate", "update_weights", "capabilities", "generate_async", "metrics",
            "close"} <= set(members)
    for name in CAPABILITIES:  # each explained where a sampler author reads
        assert f"``{name}``" in SamplerProtocol.__doc__


# ---------------------------------------------------------------- load-time checks
@pytest.fixture
def sampler_module(monkeypatch):
    module = types.ModuleType("capability_test_samplers")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _load(module, name, cls, **spec):
    setattr(module, name, cls)
    return SamplerSpec(name=name.lower(), target=f"{module.__name__}:{name}",
                       summary="test", **spec).load()


def test_a_minimal_sampler_loads(sampler_module):
    assert _load(sampler_module, "Minimal", Minimal) is Minimal


@pytest.mark.parametrize("capability, method", [("needs_close", "close"),
                                                ("reports_metrics", "metrics")])
def test_a_declared_capability_without_its_method_fails_at_load(sampler_module, capability,
                                                                method):
    declared = type("Declared", (Minimal,),
                    {"capabilities": SamplerCapabilities(**{capability: True})})
    with pytest.raises(PluginError, match=rf"sampler 'declared'.* lacks {method}\b"):
        _load(sampler_module, "Declared", declared)
    kept = type("Kept", (declared,), {method: lambda self: {}})
    assert _load(sampler_module, "Kept", kept) is kept


def test_a_wrong_record_fails_at_load_naming_the_target(sampler_module):
    wrong = type("Wrong", (Minimal,), {"capabilities": True})
    with pytest.raises(PluginError, match=r"'capability_test_samplers:Wrong' lacks "
                                          r"capabilities \(a SamplerCapabilities record\)"):
        _load(sampler_module, "Wrong", wrong)


def test_an_asynchronous_spec_needs_generate_async(sampler_module):
    with pytest.raises(PluginError, match="lacks generate_async, which its spec's "
                                          "asynchronous=True promises"):
        _load(sampler_module, "Minimal", Minimal, asynchronous=True)
    apart = type("Apart", (Minimal,), {"generate_async": lambda self, p, q: None})
    assert _load(sampler_module, "Apart", apart, asynchronous=True) is apart


# ---------------------------------------------------------------- the plugin guide
def test_the_guide_names_every_protocol_and_documents_every_capability():
    from pathlib import Path

    from astrai_core.plugins.protocols import PROTOCOLS

    text = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    for kind, protocol in PROTOCOLS.items():
        assert f"| `{kind}` | `{protocol.__name__}` |" in text, f"{protocol.__name__} is unnamed"
    section = text.split("#### Sampler capabilities", 1)[1].split("\n### ", 1)[0]
    for name in CAPABILITIES:
        assert f"| `{name}` | `False` |" in section, f"{name} is undocumented"
