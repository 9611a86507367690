"""Images in chat rows: the content-part shapes, where an image comes from, opening it.

A message's ``content`` is a string or a list of parts. A part is
``{"type": "text", "text": ...}`` or an image, in OpenAI's shape
``{"type": "image_url", "image_url": {"url": ...}}`` or Hugging Face's
``{"type": "image"}`` (its source under ``image``, ``url`` or ``path``, or else the
row's ``images`` list, taken in order). A source is a path (relative to the data file),
a ``data:image/...;base64,`` URL, or ``{"bytes": ...}`` as a ``datasets`` Image column
gives it (bytes, or base64 text once written to JSON). Remote URLs are refused: astrai
reads no network at run time.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from astrai_core.errors import DataError

IMAGE_PART_TYPES = ("image", "image_url")
_SOURCE_KEYS = ("image", "url", "path")


class PartsError(ValueError):
    """A row whose image parts do not add up (the caller adds the file and line)."""


def parts_problem(content: Any, where: str) -> str | None:
    """What is wrong with ``content`` (None: a string, or a list of well-formed text and
    image parts)."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return (f"{where}: field 'content' must be a string or a list of parts, "
                f"got {type(content).__name__}")
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind not in IMAGE_PART_TYPES:
            return (f"{where}.content[{i}] must be a text part "
                    "({\"type\": \"text\", \"text\": ...}) or an image part "
                    "({\"type\": \"image\"} or {\"type\": \"image_url\", ...})")
    return None


def has_images(messages: list[dict]) -> bool:
    """Whether any message holds an image part."""
    return any(isinstance(m.get("content"), list) and any(
        part.get("type") in IMAGE_PART_TYPES for part in m["content"]) for m in messages)


def holds_image_parts(value: Any) -> bool:
    """Whether ``value`` (a row, or any part of one) holds an image part anywhere."""
    if isinstance(value, dict):
        return value.get("type") in IMAGE_PART_TYPES or any(
            holds_image_parts(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_image_parts(v) for v in value)
    return False


def split_images(messages: list[dict], row_images: list[Any] | None
                 ) -> tuple[list[dict], list[Any]]:
    """(the messages with every image part as ``{"type": "image"}``, as chat templates
    take it, and the image sources in order of appearance)."""
    pending = list(row_images or [])
    plain, sources = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            plain.append(message)
            continue
        parts = []
        for part in content:
            if part.get("type") not in IMAGE_PART_TYPES:
                parts.append(part)
                continue
            sources.append(_source_of(part, pending))
            parts.append({"type": "image"})
        plain.append({**message, "content": parts})
    if pending:
        raise PartsError(f"the row's 'images' holds {len(pending)} more image(s) than its "
                       "messages have image parts")
    return plain, sources


def _source_of(part: dict, pending: list[Any]) -> Any:
    if part["type"] == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if url is None:
            raise PartsError("an image_url part without a url")
        return url
    source = next((part[k] for k in _SOURCE_KEYS if part.get(k) is not None), None)
    if source is not None:
        return source
    if not pending:
        raise PartsError("an image part with no source, and the row's 'images' has none left")
    return pending.pop(0)


def describe(source: Any) -> str:
    """A short name for an image source, for error messages."""
    if isinstance(source, str):
        return source[:40] + "..." if source.startswith("data:") else source
    if isinstance(source, dict) and source.get("path"):
        return str(source["path"])
    return "embedded image bytes"


def open_image(source: Any, base_dir: Path) -> Any:
    """The RGB PIL image of ``source`` (see the module docstring); ``OSError`` or
    ``ValueError`` when it cannot be read."""
    from PIL import Image

    if isinstance(source, dict):  # a datasets Image column's value
        data = source.get("bytes")
        if data is None and source.get("path"):
            return open_image(str(source["path"]), base_dir)
        source = data if isinstance(data, bytes) else base64.b64decode(str(data))
    if isinstance(source, str):
        if source.startswith("data:"):
            header, _, payload = source.partition(",")
            if ";base64" not in header:
                raise ValueError("a data URL that is not base64")
            source = base64.b64decode(payload)
        elif "://" in source:
            raise ValueError("remote image URLs are not read (no network at run time); "
                             "download it and give its path")
        else:
            path = Path(source)
            source = (path if path.is_absolute() else base_dir / path).read_bytes()
    image = Image.open(io.BytesIO(source))
    image.load()
    return image.convert("RGB")


def _reason(exc: Exception) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, UnidentifiedImageError):  # PIL's message names a BytesIO object
        return "not an image file"
    return str(exc).split("\n")[0]


def open_row_images(sources: list[Any], base_dir: Path, where: str) -> list[Any]:
    """Every image of a row, opened; a DataError naming ``where`` (file and line) and the
    image when one cannot be read."""
    images = []
    for source in sources:
        try:
            images.append(open_image(source, base_dir))
        except (OSError, ValueError) as exc:
            reason = _reason(exc)
            raise DataError(f"{where}: image {describe(source)} cannot be read ({reason})"
                            ) from None
    return images
