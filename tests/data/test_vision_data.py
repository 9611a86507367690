"""Chat rows with images for a vision-language model: every image shape and source gives
the processor's own tokens for the chat, targets on the assistant's text only, the pixel
tensors cached (safetensors) and found again; an unreadable image is one error line."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch

from astrai_core.data.tokenize import tokenize_source
from astrai_core.data.tokenizer import load_tokenizer
from astrai_core.errors import DataError
from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir


def _png(seed, size=(28, 28)) -> bytes:
    buffer = io.BytesIO()
    tiny_image(seed, size).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return write_vlm_dir(tmp_path_factory.mktemp("vlm") / "gemma3", "gemma3")


def _write(tmp_path, rows):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_image_shapes_and_sources_give_the_processors_tokens(tmp_path, gemma):
    (tmp_path / "img").mkdir()
    tiny_image(0).save(tmp_path / "img" / "a.png")
    data_url = "data:image/png;base64," + base64.b64encode(_png(1, (40, 20))).decode()
    column = {"bytes": base64.b64encode(_png(2)).decode(), "path": None}  # datasets' Image
    user = [{"type": "image_url", "image_url": {"url": "img/a.png"}},
            {"type": "text", "text": "2+2=?"}, {"type": "image", "image": data_url},
            {"type": "image"}]
    rows = [{"messages": [{"role": "user", "content": user},
                          {"role": "assistant", "content": "4"}], "images": [column]},
            {"messages": [{"role": "user", "content": "1+1=?"},
                          {"role": "assistant", "content": "2"}]}]
    tokenizer = load_tokenizer(gemma)
    processor = tokenizer.astrai_processor
    source = tokenize_source(_write(tmp_path, rows), "chat", tokenizer, tmp_path / "cache")

    plain = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2=?"},
                                          {"type": "image"}, {"type": "image"}]},
             {"role": "assistant", "content": "4"}]
    text = processor.apply_chat_template(plain, tokenize=False)
    expected = processor(text=[text], images=[[tiny_image(0), tiny_image(1, (40, 20)),
                                               tiny_image(2)]], return_tensors="np")
    ids, targets = source.fields["input"].tokens_of(0), source.fields["input"].targets_of(0)
    assert ids.tolist() == expected["input_ids"][0].tolist()
    answer = processor.tokenizer("4<|end|>", add_special_tokens=False)["input_ids"]
    assert ids[targets.astype(bool)].tolist() == answer  # the assistant's text, nothing else
    tensors = source.images.of(0)
    np.testing.assert_array_equal(tensors["pixel_values"], expected["pixel_values"])
    assert tensors["pixel_values"].shape[0] == 3
    assert source.images.of(1) == {}  # a text row of the same file
    assert (source.cache_entry / "images.safetensors").is_file()


def test_second_tokenization_hits_the_cache_and_the_processor_config_is_in_the_key(
        tmp_path, gemma, caplog):
    from transformers import AutoProcessor

    tiny_image(0).save(tmp_path / "a.png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "path": "a.png"}]},
                          {"role": "assistant", "content": "4"}]}]
    path = _write(tmp_path, rows)
    first = tokenize_source(path, "chat", load_tokenizer(gemma), tmp_path / "cache")
    mtime = (first.cache_entry / "images.safetensors").stat().st_mtime_ns
    second = tokenize_source(path, "chat", load_tokenizer(gemma), tmp_path / "cache")
    assert second.cache_entry == first.cache_entry
    assert (second.cache_entry / "images.safetensors").stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(second.images.of(0)["pixel_values"],
                                  first.images.of(0)["pixel_values"])
    other = load_tokenizer(gemma)
    other.astrai_processor = AutoProcessor.from_pretrained(str(gemma), image_mean=[0.1] * 3)
    third = tokenize_source(path, "chat", other, tmp_path / "cache")
    assert third.cache_entry != first.cache_entry  # other normalisation, other pixels
    assert not np.array_equal(third.images.of(0)["pixel_values"],
                              first.images.of(0)["pixel_values"])


@pytest.mark.parametrize("content, images, message", [
    ([{"type": "image", "path": "missing.png"}], None, "image missing.png cannot be read"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], None,
     "remote image URLs are not read"),
    ([{"type": "image"}], None, "no source"),
    ([{"type": "text", "text": "hi"}], ["a.png"], "more image(s) than its messages"),
])
def test_bad_images_name_the_file_and_line(tmp_path, gemma, content, images, message):
    good = {"messages": [{"role": "user", "content": "1+1=?"},
                         {"role": "assistant", "content": "2"}]}
    bad = {"messages": [{"role": "user", "content": content},
                        {"role": "assistant", "content": "4"}],
           **({"images": images} if images else {})}
    path = _write(tmp_path, [good, bad])
    with pytest.raises(DataError, match=rf"data file {re.escape(str(path))}, line 2: .*{re.escape(message)}") as err:
        tokenize_source(path, "chat", load_tokenizer(gemma), tmp_path / "cache")
    assert "\n" not in str(err.value)


def test_image_rows_need_a_model_with_a_processor(tmp_path):
    from astrai_core.testing.runs import ARITH_TOKENIZER

    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "path": "a.png"}]},
                          {"role": "assistant", "content": "4"}]}]
    with pytest.raises(DataError, match="line 1: the row holds images, and the model has no "
                                        "image processor"):
        tokenize_source(_write(tmp_path, rows), "chat", load_tokenizer(ARITH_TOKENIZER),
                        tmp_path / "cache")


def test_a_datasets_image_column_mapped_with_columns_reaches_the_batch(tmp_path, gemma):
    """A save_to_disk dataset whose images are an Image column (renamed to ``images`` by
    the ``columns`` option): the stored PNG bytes, not a decoded copy, reach the
    processor, and the batch carries the processor's pixels."""
    import datasets

    from astrai_core.data import build_train_loader
    from astrai_core.data.config import DataConfig

    pictures = [[{"bytes": _png(4), "path": None}, {"bytes": _png(5, (20, 40)), "path": None}]]
    user = [{"type": "image"}, {"type": "text", "text": "2+2=?"}, {"type": "image"}]
    table = datasets.Dataset.from_dict({
        "messages": [[{"role": "user", "content": user},  # Arrow: every content a list
                      {"role": "assistant", "content": [{"type": "text", "text": "4"}]}]],
        "pictures": pictures}).cast_column("pictures", datasets.List(datasets.Image()))
    table.save_to_disk(str(tmp_path / "set"))
    config = DataConfig.model_validate({
        "sources": [{"path": str(tmp_path / "set"), "format": "chat",
                     "columns": {"pictures": "images"}}],
        "seq_len": 64, "batch_size": 1, "cache_dir": str(tmp_path / "cache")})
    tokenizer = load_tokenizer(gemma)
    batch = next(build_train_loader(config, tokenizer))
    processor = tokenizer.astrai_processor
    plain = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2=?"},
                                          {"type": "image"}]},
             {"role": "assistant", "content": "4"}]
    text = processor.apply_chat_template(plain, tokenize=False)
    expected = processor(text=[text], images=[[tiny_image(4), tiny_image(5, (20, 40))]],
                         return_tensors="pt")
    length = expected["input_ids"].shape[1]
    assert batch["input_ids"][0, :length].tolist() == expected["input_ids"][0].tolist()
    assert batch["image/pixel_values.rows"].tolist() == [2]
    assert torch.equal(batch["image/pixel_values"][0], expected["pixel_values"])
    assert torch.equal(batch["image/token_type_ids"][0, :length], expected["token_type_ids"][0])


def test_images_in_other_formats_are_refused_until_they_are_read(tmp_path, gemma):
    row = {"prompt": [{"role": "user", "content": [{"type": "image", "path": "a.png"}]}],
           "completion": [{"role": "assistant", "content": "4"}]}
    path = _write(tmp_path, [row])
    with pytest.raises(DataError, match=r"line 1: images are read in chat and prompt rows, "
                                        r"not yet in prompt_completion rows"):
        tokenize_source(path, "prompt_completion", load_tokenizer(gemma), tmp_path / "cache")


@pytest.mark.parametrize("model_type", ["gemma3", "idefics3"])
def test_a_share_of_a_batch_with_text_rows_only_runs_no_pixels(model_type):
    """Rows cut from a batch (a rank's share) may hold no image: no empty pixel tensor
    reaches the vision tower; a row with images keeps its own, in row order."""
    from astrai_core.data.image_batch import batch_images, collate_images

    pixels = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    rows = [[{"input_ids": np.zeros(3)}], [{"input_ids": np.zeros(3),
                                            "image/pixel_values": pixels,
                                            "image/token_type_ids": np.ones(3, dtype=np.int64)}]]
    batch = collate_images(rows, width=4)
    text_only = {key: value[:1] for key, value in batch.items()}
    assert batch_images(text_only, model_type) is None
    images = batch_images(batch, model_type)
    expected = torch.from_numpy(pixels)
    if model_type == "idefics3":  # [B, images, ...], a row without images all zeros
        expected = torch.stack([torch.zeros_like(expected), expected])
    assert torch.equal(images["pixel_values"], expected)
    assert images["token_type_ids"].tolist() == [[0, 0, 0, 0], [1, 1, 1, 0]]
