"""A checkpoint from someone else cannot run code on --resume: its pickles (dcp/.metadata,
training_state.pt) are read only after the manifest verifies, and then through restricted
unpicklers. Each payload here would create a file when unpickled by a plain unpickler."""

from __future__ import annotations

import pickle

import pytest

from astrai_core.checkpoints.manifest import MANIFEST_FILE, write_manifest
from astrai_core.config.schema import RunConfig
from astrai_core.training.run import train
from tests.training.conftest import astrai, tiny_config, write_config


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config path, the run's step_2 checkpoint) of a finished 2-step run."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    config = tiny_config(tmp_path, max_steps=2, save_every=2, progress=False)
    train(RunConfig.model_validate(config))
    config["trainer"]["max_steps"] = 4  # --resume has something to do
    return write_config(tmp_path, config), tmp_path / "run" / "checkpoints" / "step_2"


def test_the_restricted_unpickler_reads_real_dcp_metadata(trained):
    from astrai_core.checkpoints.safe_dcp import read_dcp_metadata

    path = trained[1] / "dcp" / ".metadata"
    data = path.read_bytes()
    assert read_dcp_metadata(data, str(path)) == pickle.loads(data)  # our own file: trusted


@pytest.mark.parametrize("target", ["dcp/.metadata", "training_state.pt"])
@pytest.mark.parametrize("manifest", ["rewritten", "removed"])
def test_a_pickle_payload_never_runs_on_resume(trained, tmp_path, target, manifest):
    config_path, checkpoint = trained
    marker = tmp_path / "payload_ran"
    path = checkpoint / target
    original = path.read_bytes()
    manifest_text = (checkpoint / MANIFEST_FILE).read_text()
    try:
        path.write_bytes(pickle.dumps(_Payload(marker)))
        if manifest == "rewritten":  # the attacker rewrote the manifest too: it verifies
            write_manifest(checkpoint)
        else:
            (checkpoint / MANIFEST_FILE).unlink()
        resumed = astrai("train", str(config_path), "--resume")
    finally:
        path.write_bytes(original)
        (checkpoint / MANIFEST_FILE).write_text(manifest_text)
    assert not marker.exists(), "the checkpoint's pickle ran code"
    assert resumed.returncode != 0
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    named = str(path) if manifest == "rewritten" else f"{checkpoint} has no manifest.json"
    assert named in errors[0]
