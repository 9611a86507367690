"""Prompt rows (format: prompt) with images for a vision-language model: every image
shape and source a chat row takes gives the processor's own tokens and image tensors for
the rendered prompt, cached and found again; the ``images`` column is no reward column;
an unreadable image is one error line naming the file, the line and the image."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from astrai_core.data.loader import PromptExamples
from astrai_core.data.tokenize import tokenize_source
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.errors import DataError
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir
from astrai_core.testing.runs import ARITH_TOKENIZER


@pytest.fixture(scope="module", params=["gemma3", "idefics3"])
def vlm(request, tmp_path_factory):
    return write_vlm_dir(tmp_path_factory.mktemp("vlm") / request.param, request.param)


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    tiny_image(seed).save(buffer, format="PNG")
    return buffer.getvalue()


def _write(tmp_path, rows):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _rows(tmp_path):
    """Five prompt rows of the same image and text "1+1=", in every shape, and one of
    text only."""
    tiny_image(4).save(tmp_path / "a.png")
    url = "data:image/png;base64," + base64.b64encode(_png(4)).decode()
    column = {"bytes": base64.b64encode(_png(4)).decode(), "path": None}  # datasets' Image
    text = {"type": "text", "text": "1+1="}
    return [
        {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "a.png"}}, text]}], "answer": "2"},
        {"prompt": [{"role": "user", "content": [{"type": "image"}, text]}],
         "images": [url], "answer": "2"},
        {"prompt": "1+1=", "images": [column], "answer": "2"},
        {"messages": [{"role": "user", "content": [
            {"type": "image", "image": str(tmp_path / "a.png")}, text]}], "answer": "2"},
        {"messages": [{"role": "user", "content": "1+1="}], "images": ["a.png"], "answer": "2"},
        {"prompt": "2+2=", "answer": "4"},
    ]


def test_every_shape_gives_the_processors_tokens_and_tensors(tmp_path, vlm):
    tokenizer = load_tokenizer(vlm)
    processor = tokenizer.astrai_processor
    path = _write(tmp_path, _rows(tmp_path))
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "1+1="}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    expected = processor(text=[text], images=[[tiny_image(4)]], add_special_tokens=False,
                         return_tensors="np")
    for attempt in ("tokenized", "cached"):
        source = tokenize_source(path, "prompt", tokenizer, tmp_path / "cache")
        examples = PromptExamples(source, None)
        assert examples.has_images
        for row in range(5):
            record = examples.get(row)
            assert record.prompt_ids == expected["input_ids"][0].tolist(), (attempt, row)
            assert record.columns == {"answer": "2"}  # the images are not a column
            assert record.images.keys() == expected.keys() - {"input_ids", "attention_mask"}
            for name, value in record.images.items():
                np.testing.assert_array_equal(value, expected[name])
        plain = examples.get(5)
        assert plain.images is None and plain.columns == {"answer": "4"}


def test_a_missing_image_is_one_line_naming_file_line_and_image(tmp_path, vlm):
    rows = _rows(tmp_path)
    rows[3]["messages"][0]["content"][0]["image"] = "gone.png"
    path = _write(tmp_path, rows)
    with pytest.raises(DataError) as caught:
        tokenize_source(path, "prompt", load_tokenizer(vlm), tmp_path / "cache")
    assert str(caught.value) == (f"data file {path}, line 4: image gone.png cannot be read "
                                 "(no such file)")
    assert not list((tmp_path / "cache").glob("prompts-*"))  # nothing half-written stays


def test_images_for_a_text_model_are_refused(tmp_path):
    path = _write(tmp_path, _rows(tmp_path)[:1])
    with pytest.raises(DataError, match="line 1: the row holds images, and the model has no "
                                        "image processor"):
        tokenize_source(path, "prompt", load_tokenizer(ARITH_TOKENIZER), tmp_path / "cache")


def test_more_listed_images_than_image_parts_is_refused(tmp_path, vlm):
    rows = _rows(tmp_path)
    rows[1]["images"] = rows[1]["images"] * 2
    with pytest.raises(DataError, match="line 2: the row's 'images' holds 1 more image"):
        tokenize_source(_write(tmp_path, rows), "prompt", load_tokenizer(vlm), tmp_path / "c")
