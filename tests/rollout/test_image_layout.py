"""Image tensors of rollout rows brought to one layout, as the ranks' gather does before
joining them (rollout/gather.py): each rank's rows may hold more images (Qwen-VL patches,
Idefics3 tiles) than another's, or none; checked against hand-built tensors."""

from __future__ import annotations

import torch

from astrai_core.rollout.images import (concat_images, conformed_images, image_layout,
                                        joint_layout)


def _part(rows: int, most: int, width: int) -> dict[str, torch.Tensor]:
    """``rows`` rows of ``most`` 3-wide patches each (values from 1), per-token types of
    ``width`` columns."""
    pixels = torch.arange(1, rows * most * 3 + 1, dtype=torch.float32).reshape(rows, most, 3)
    return {"image/pixel_values": pixels,
            "image/pixel_values.rows": torch.full((rows,), most, dtype=torch.long),
            "image/token_type_ids": torch.ones(rows, width, dtype=torch.long)}


def test_rows_are_padded_to_the_most_images_over_every_part():
    few, many = _part(2, 2, 4), _part(1, 5, 6)
    layout = joint_layout([image_layout(few), image_layout(many), image_layout({})])
    assert layout == {"image/pixel_values": ((5, 3), torch.float32),
                      "image/pixel_values.rows": ((), torch.long),
                      "image/token_type_ids": ((4,), torch.long)}  # widened apart
    padded = conformed_images(few, 2, layout, prompt_width=6)
    assert padded["image/pixel_values"].shape == (2, 5, 3)
    assert torch.equal(padded["image/pixel_values"][:, :2], few["image/pixel_values"])
    assert not padded["image/pixel_values"][:, 2:].any()  # zero images after a row's own
    assert padded["image/pixel_values.rows"].tolist() == [2, 2]
    assert padded["image/token_type_ids"].tolist() == [[0, 0, 1, 1, 1, 1]] * 2  # left
    none = conformed_images({}, 3, layout, prompt_width=6)  # a rank of text prompts
    assert none["image/pixel_values"].shape == (3, 5, 3) and not none["image/pixel_values"].any()
    assert none["image/pixel_values.rows"].tolist() == [0, 0, 0]
    assert none["image/token_type_ids"].shape == (3, 6)


def test_parts_are_joined_row_by_row_in_one_layout():
    few, many = _part(2, 2, 4), _part(1, 5, 6)
    joined = concat_images([few, {}, many], [2, 3, 1], prompt_width=6)
    assert joined["image/pixel_values.rows"].tolist() == [2, 2, 0, 0, 0, 5]
    pixels = joined["image/pixel_values"]
    assert pixels.shape == (6, 5, 3)
    assert torch.equal(pixels[:2, :2], few["image/pixel_values"]) and not pixels[:2, 2:].any()
    assert not pixels[2:5].any() and torch.equal(pixels[5:], many["image/pixel_values"])
    assert joined["image/token_type_ids"].sum(1).tolist() == [4, 4, 0, 0, 0, 6]
