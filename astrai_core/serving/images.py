"""Image parts of a chat request -> the prompt's token ids and the processor's image inputs.

An image reaches the server inside the request, as a ``data:image/...;base64,`` URL in an
``image_url`` part: the server never fetches a URL (no network, and no reading of its own
files on a client's behalf). Images are decoded and rendered by the data layer
(:func:`~astrai_core.data.images.open_image`, :func:`~astrai_core.data.images.split_images`,
the model's processor through :mod:`~astrai_core.data.vision_render`), as training rows are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astrai_core.data.images import IMAGE_PART_TYPES, has_images, open_image, split_images
from astrai_core.data.vision_render import process_prompt, processor_of
from astrai_core.serving.prompts import chat_text
from astrai_core.serving.protocol import APIError, ChatCompletionRequest


def image_parts(messages: list[dict]) -> list[tuple[str, str]]:
    """(where, url) of each image part, in order (``messages[i].content[j]``)."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                found.append((f"messages[{i}].content[{j}]", part["image_url"]["url"]))
    return found


def decode_images(messages: list[dict]) -> list[Any]:
    """The RGB images of the request's image parts; a 400 naming the part for a URL that
    is not a data: URL or an image that cannot be decoded."""
    images = []
    for where, url in image_parts(messages):
        if not url.startswith("data:"):
            raise APIError(400, f"{where}.image_url.url: this server never fetches URLs; send "
                           "the image itself as a data: URL (data:image/png;base64,...)",
                           param="messages", code="image_url_not_data")
        try:
            images.append(open_image(url, Path()))  # a data: URL: no file is read
        except Exception as error:  # noqa: BLE001 - base64, PIL and size errors alike
            raise APIError(400, f"{where}: the image cannot be decoded ({error})",
                           param="messages", code="invalid_image") from None
    return images


def vision_prompt(engine: Any, tokenizer: Any, request: ChatCompletionRequest, use_tools: bool,
                  max_chars: int | None) -> tuple[list[int], dict[str, Any]] | None:
    """(prompt ids, image inputs) of a chat request with image parts; None without any.
    400 when the model (or its sampler) takes no images."""
    if not has_images(request.messages):
        return None
    where = image_parts(request.messages)[0][0]
    processor = processor_of(tokenizer)
    if processor is None:
        raise APIError(400, f"{where}: image_url parts are not supported: this model takes no "
                       "images (a text-only model)", param="messages", code="images_not_supported")
    if not getattr(engine, "supports_images", False):
        raise APIError(400, f"{where}: this server's sampler takes no images; serve the model "
                       "with --sampler torch", param="messages", code="images_not_supported")
    images = decode_images(request.messages)
    plain, _ = split_images(request.messages, None)
    text = chat_text(tokenizer, request, use_tools, max_chars, messages=plain)
    try:
        return process_prompt(processor, text, images)
    except ValueError as error:  # e.g. an image the processor cannot size
        raise APIError(400, f"the model's processor refused the images: {error}",
                       param="messages", code="invalid_image") from None
