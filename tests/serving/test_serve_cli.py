"""`astrai serve` on the command line: registered without heavy imports, clear errors."""

from __future__ import annotations

from astrai_core.testing import run_astrai


def test_serve_help_stays_light():
    result = run_astrai("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert "--served-model-name" in result.stdout and "--tool-call-parser" in result.stdout
    assert result.stderr.strip().endswith("TORCH_NOT_IMPORTED")


def test_list_plugins_does_not_import_the_server():
    result = run_astrai("list-plugins")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith("TORCH_NOT_IMPORTED")


def test_missing_model_dir_is_one_clear_error(tmp_path):
    result = run_astrai("serve", str(tmp_path / "nope"), "--port", "1")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "nope" in result.stderr


def test_unknown_sampler_lists_the_available_ones(random_checkpoint):
    result = run_astrai("serve", str(random_checkpoint), "--sampler", "nosuch", "--port", "1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "torch" in result.stderr


def test_a_registry_sampler_other_than_torch_goes_through_the_adapter(random_checkpoint):
    """The --sampler vllm path, with a stand-in sampler registered in-process under another name."""
    import types

    from astrai_core import SamplerSpec, hookimpl
    from astrai_core.cli.serve import build_engine
    from astrai_core.plugins import load_plugins, register, unregister
    from astrai_core.serving.engine import BatchingEngine
    from astrai_core.serving.sampler_engine import SamplerEngine

    module = types.ModuleType("stand_in_sampler_plugin")

    @hookimpl
    def astrai_samplers():
        return [SamplerSpec(name="stand_in", target="astrai_core.sampling.torch_sampler:TorchSampler",
                            summary="the torch sampler under another name")]

    module.astrai_samplers = astrai_samplers
    register(module)
    try:
        registry = load_plugins()
        adapter = build_engine(registry, "stand_in", random_checkpoint, "cpu", 8)
        native = build_engine(registry, "torch", random_checkpoint, "cpu", 8)
    finally:
        unregister(module)
    try:
        assert isinstance(adapter, SamplerEngine) and isinstance(native, BatchingEngine)
        assert adapter.max_context == native.max_context == 1024
    finally:
        adapter.close()
        native.close()


def test_a_transformers_backend_checkpoint_is_served(tmp_path):
    """A checkpoint of a family without a native importer answers the OpenAI chat API
    (the torch sampler behind the generic engine)."""
    from astrai_core.checkpoints.hf_model import load_transformers_model, write_backend_record
    from astrai_core.checkpoints.manifest import write_manifest
    from astrai_core.serving.sampler_engine import SamplerEngine
    from astrai_core.testing.hf_models import write_hf_model_dir
    from astrai_core.testing.serving import live_server

    directory = write_hf_model_dir(tmp_path / "olmo2", "olmo2")
    write_backend_record(load_transformers_model(directory), directory)
    write_manifest(directory)  # a checkpoint as a run writes it
    with live_server(directory) as live:
        assert isinstance(live.engine, SamplerEngine)
        reply = live.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+2="}], max_tokens=4,
            temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens >= 1
