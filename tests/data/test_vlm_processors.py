"""A vision-language model directory's processor without torchvision: the Qwen-VL and
SmolVLM processors are built as their own classes less the video processor, from
transformers 5's layout and from the older one of the published checkpoints
(preprocessor_config.json, chat_template.json, a video processor config), with the same
tokens and pixels, which a checkpoint's copy of the files keeps; videos are refused, not
dropped; a copy pickles; a directory whose processor cannot be built is one error line
naming it."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from astrai_core.data.processors import load_image_processor
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.errors import DataError
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir

CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2=?"},
                                     {"type": "image"}]},
        {"role": "assistant", "content": "4"}]
IMAGES = [[tiny_image(0), tiny_image(1, (40, 20))]]


def _outputs(processor) -> dict:
    text = processor.apply_chat_template(CHAT, tokenize=False)
    return dict(processor(text=[text], images=IMAGES, return_tensors="np"))


def _as_published(directory) -> None:
    """Rewrite a transformers 5 processor directory as the published Qwen-VL and SmolVLM
    checkpoints lay theirs out."""
    config = json.loads((directory / "processor_config.json").read_text())
    images = config.pop("image_processor")
    (directory / "processor_config.json").unlink()
    if config.keys() - {"processor_class"}:  # SmolVLM's image_seq_len
        (directory / "processor_config.json").write_text(json.dumps(config))
    images["processor_class"] = config["processor_class"]
    (directory / "preprocessor_config.json").write_text(json.dumps(images))
    template = (directory / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").unlink()
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    video = {**images, "video_processor_type": images["image_processor_type"].replace(
        "Image", "Video")}
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video))


@pytest.mark.parametrize("family, name", [("qwen2_5_vl", "Qwen2_5_VLProcessor"),
                                          ("qwen3_vl", "Qwen3VLProcessor"),
                                          ("smolvlm", "SmolVLMProcessor")])
def test_published_layout_loads_with_the_same_tokens_and_pixels(tmp_path, family, name):
    directory = write_vlm_dir(tmp_path / family, family)
    expected = _outputs(load_image_processor(directory))
    _as_published(directory)
    processor = load_tokenizer(directory).astrai_processor
    assert type(processor).__name__ == name
    assert type(processor.image_processor).__name__.endswith("Pil")
    got = _outputs(processor)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_checkpoint_carries_the_published_processor_files(tmp_path):
    from astrai_core.checkpoints.native_files import copy_tokenizer_files

    source = write_vlm_dir(tmp_path / "q", "qwen2_5_vl")
    _as_published(source)
    (tmp_path / "step").mkdir()
    copied = copy_tokenizer_files(source, tmp_path / "step")
    assert {"preprocessor_config.json", "chat_template.json",
            "video_preprocessor_config.json"} <= set(copied)
    expected, got = (_outputs(load_image_processor(d)) for d in (source, tmp_path / "step"))
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm"])
def test_videos_are_refused_and_a_copy_pickles(tmp_path, family):
    processor = load_image_processor(write_vlm_dir(tmp_path / family, family))
    with pytest.raises(ValueError, match="has no video processor: videos need torchvision"):
        processor(text=["hi"], videos=[[np.zeros((2, 28, 28, 3), dtype=np.uint8)]])
    copy = pickle.loads(pickle.dumps(processor))
    assert type(copy) is type(processor)
    expected, got = _outputs(processor), _outputs(copy)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "processor_config.json").write_text("{"),
     "processor_config.json is not valid JSON"),
    (lambda d: (d / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Qwen2_5_VLProcessor", "image_processor": {
            "image_processor_type": "NoSuchImageProcessor"}})), "Unrecognized image processor"),
])
def test_a_processor_that_cannot_be_built_is_one_line_naming_the_directory(
        tmp_path, damage, message):
    directory = write_vlm_dir(tmp_path / "q", "qwen2_5_vl")
    damage(directory)
    with pytest.raises(DataError, match=f"cannot load the image processor in {directory}: "
                                        f".*{message}") as err:
        load_tokenizer(directory)
    assert "\n" not in str(err.value)
