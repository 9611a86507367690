"""A hostile checkpoint resumed on 2 processes: each refusal is one line naming the file,
repeated by the launcher in its last line, never pages of every rank's traceback."""

from __future__ import annotations

import pytest

from tests.checkpoints.test_contained import hostile_metadata, one_error_line, tensor_items
from tests.distributed.conftest import ok, train
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("hostile2")
    config = tiny_config(tmp_path, max_steps=2, save_every=2, progress=False)
    ok(train(config, tmp_path, "first"))  # one process: DCP reshards it onto two
    config["trainer"]["max_steps"] = 4
    return config, tmp_path


def test_a_hostile_item_inside_its_file_is_one_line_on_two_processes(trained):
    config, tmp_path = trained
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"

    def rewrite(storage):
        items = tensor_items(storage)
        other = next(k for k in items if storage[k].length != storage[items[0]].length)
        storage[items[0]], storage[other] = storage[other], storage[items[0]]

    with hostile_metadata(checkpoint, rewrite):
        line = one_error_line(train(config, tmp_path, "resume", 2, "--resume"),
                              "error: the distributed")
    shard = sorted((checkpoint / "dcp").glob("*.distcp"))[0]
    # a rank's own line, whether it had exited (status 2) or torchrun stopped it while it
    # was exiting, after its peer's gloo aborted
    assert f"{shard}: cannot read the checkpoint's state" in line, line


def test_an_item_beyond_its_file_is_one_line_on_two_processes(trained):
    config, tmp_path = trained
    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"

    def rewrite(storage):
        storage[tensor_items(storage)[0]].length = 3 * 1024**3

    with hostile_metadata(checkpoint, rewrite) as metadata:
        line = one_error_line(train(config, tmp_path, "beyond", 2, "--resume"),
                              "error: the distributed")
    assert f"{metadata}: storage item" in line, line
    assert "lies outside its file" in line
