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
