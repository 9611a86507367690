"""Tokenize a JSONL source once and cache it as memory-mapped arrays.

A cache entry is a directory ``<cache_dir>/<file stem>-<format>-<key>/`` holding, per
field, ``<field>.tokens.bin`` (int32, all sequences end to end), ``<field>.offsets.bin``
(int64, n+1 boundaries) and for masked fields ``<field>.targets.bin`` (uint8 target
mask), plus ``records.jsonl`` for prompts (and the labels of unpaired rows),
``margin.bin`` (float64, NaN where a row has none) for preference pairs,
``images.safetensors`` (each row's image tensors, for a vision-language model's chats;
:mod:`astrai_core.data.vision_render`) and ``meta.json``. It is written in a
temporary directory and renamed, so an entry that exists is complete. The key hashes
the source (absolute path, size, mtime), the format, the tokenizer (vocabulary,
pipeline, special tokens, chat template), a vision-language model's processor config and
CACHE_FORMAT_VERSION. Sequences are
stored whole: truncation and packing happen when batches are built, so changing
``seq_len`` reuses the cache.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from astrai_core.data import render
from astrai_core.data.images import (PartsError, has_images, holds_image_parts,
                                     open_row_images, split_images)
from astrai_core.data.sources import read_rows, require_file
from astrai_core.data.tokenizer import tokenizer_fingerprint
from astrai_core.data.vision_render import (TENSORS_FILE, RowTensors, RowTensorsWriter,
                                            process_prompt, processor_fingerprint,
                                            processor_of, render_vision_chat)
from astrai_core.errors import DataError
from astrai_core.log import get_logger

# Bump whenever rendering or the on-disk layout changes: old entries stop matching.
CACHE_FORMAT_VERSION = 2
FIELDS = {"text": ("input",), "chat": ("input",), "prompt_completion": ("input",),
          "preference": ("chosen", "rejected"),
          "unpaired": ("completion",), "prompt": ("prompt",)}
RECORD_FORMATS = ("prompt", "unpaired")  # formats whose rows also keep a JSON record
MARGIN_FILE = "margin.bin"
IMAGE_FORMATS = ("chat", "prompt")  # formats whose rows may hold images
_TEXT_CHUNK = 1024  # rows tokenized per batched call for the text format
Encoded = dict[str, tuple[list[int], list[int] | None]]  # field -> (token ids, target mask)

log = get_logger(__name__)


@dataclass(frozen=True)
class Ragged:
    """Variable-length token sequences stored end to end; ``targets`` None means all 1."""

    tokens: np.ndarray    # int32 [total tokens]
    offsets: np.ndarray   # int64 [n + 1]
    targets: np.ndarray | None  # uint8 [total tokens] or None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def tokens_of(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def targets_of(self, i: int) -> np.ndarray | None:
        return None if self.targets is None else self.targets[self.offsets[i]:self.offsets[i + 1]]


@dataclass(frozen=True)
class TokenizedSource:
    """One tokenized JSONL file: its fields (see FIELDS) and, for prompts, the records."""

    path: Path
    format: str
    fields: dict[str, Ragged]
    records: list[dict] | None  # prompt: {"prompt_text", "columns"}; unpaired: {"label"}
    cache_entry: Path
    margins: np.ndarray | None = None  # preference format: float64 per pair, NaN: none given
    images: RowTensors | None = None  # chat rows' image tensors (a vision-language model)

    def __len__(self) -> int:
        return len(next(iter(self.fields.values())))


@dataclass(frozen=True)
class RenderOptions:
    """How rows become tokens beyond their format (``data.chat_template``,
    ``data.completion_only_loss``)."""

    chat_template: bool = True          # string prompts of prompt rows as a user turn
    completion_only_loss: bool = True   # prompt_completion rows: targets on the completion

    def identity(self, fmt: str, tokenizer: Any) -> dict[str, bool]:
        """The options that change ``fmt``'s tokens (none: the cache key stays as it was)."""
        out = {}
        if fmt == "prompt" and render.wraps_string_prompts(tokenizer, self.chat_template):
            out["wrap_prompts"] = True
        if fmt == "prompt_completion" and not self.completion_only_loss:
            out["full_loss"] = True
        return out


def cache_key(path: Path, fmt: str, tokenizer: Any, tools: list[dict] | None = None,
              options: RenderOptions = RenderOptions()) -> str:
    stat = path.stat()
    identity = {"version": CACHE_FORMAT_VERSION, "path": str(path.resolve()),
                "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "format": fmt,
                "tokenizer": tokenizer_fingerprint(tokenizer)}
    if tools:  # prompts rendered with tool schemas are other tokens (no key change without)
        identity["tools"] = tools
    identity.update(options.identity(fmt, tokenizer))
    processor = processor_of(tokenizer)
    if processor is not None and fmt in IMAGE_FORMATS:  # image rows: the processor's tensors
        identity["processor"] = processor_fingerprint(processor)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def tokenize_source(path: str | Path, fmt: str, tokenizer: Any, cache_dir: str | Path,
                    field: str = "data", tools: list[dict] | None = None,
                    options: RenderOptions = RenderOptions()) -> TokenizedSource:
    """The tokenized ``path``: loaded from the cache, or tokenized and cached first.

    ``field`` names the config field holding ``path``, for error messages. ``tools``:
    OpenAI tool schemas given to the chat template of ``prompt`` rows (an environment's
    ``prompt_tools``). ``options``: see RenderOptions.
    """
    path = Path(path)
    require_file(path, field)
    if fmt not in FIELDS:
        raise DataError(f"{field}: unknown data format {fmt!r}; expected one of {', '.join(FIELDS)}")
    if fmt == "chat":
        render.require_chat_template(tokenizer, f"the chat data in {path}")
    cache_dir = Path(cache_dir)
    entry = cache_dir / f"{path.stem}-{fmt}-{cache_key(path, fmt, tokenizer, tools, options)}"
    if not (entry / "meta.json").is_file():
        _build_entry(path, fmt, tokenizer, entry, field, tools, options)
    else:
        log.info("data cache hit", source=str(path), entry=str(entry))
    return open_entry(entry, path)


def _build_entry(path: Path, fmt: str, tokenizer: Any, entry: Path, field: str,
                 tools: list[dict] | None, options: RenderOptions) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        count = _write_fields(path, fmt, tokenizer, tmp, field, tools, options)
        meta = {"version": CACHE_FORMAT_VERSION, "source": str(path.resolve()), "format": fmt,
                "rows": count}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, entry)
        except OSError:  # another process finished the same entry first: keep theirs
            if not (entry / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("tokenized data", source=str(path), format=fmt, rows=count, entry=str(entry))


def _write_fields(path: Path, fmt: str, tokenizer: Any, out: Path, field: str,
                  tools: list[dict] | None, options: RenderOptions) -> int:
    writers = {name: _RaggedWriter(out, name, with_targets=fmt != "text" and name != "prompt")
               for name in FIELDS[fmt]}
    records = ((out / "records.jsonl").open("w", encoding="utf-8") if fmt in RECORD_FORMATS
               else None)
    margins: list[float] = []
    images = (RowTensorsWriter(out) if fmt in IMAGE_FORMATS and processor_of(tokenizer)
              else None)
    count = 0
    try:
        for encoded, record in _encode_rows(path, fmt, tokenizer, field, tools, options):
            for name, (ids, targets) in encoded.items():
                writers[name].append(ids, targets)
            if images is not None:  # a chat's record is its tensors; a prompt's holds them
                images.append((record.pop("tensors", {}) if fmt == "prompt" else record) or {})
            if records is not None:
                records.write(json.dumps(record) + "\n")
            elif fmt == "preference":
                margins.append(math.nan if record is None else record["margin"])
            count += 1
    finally:
        for writer in writers.values():
            writer.close()
        if records is not None:
            records.close()
    if images is not None:
        images.close()
    if fmt == "preference":
        np.asarray(margins, dtype=np.float64).tofile(out / MARGIN_FILE)
    return count


def _encode_rows(path: Path, fmt: str, tokenizer: Any, field: str,
                 tools: list[dict] | None = None, options: RenderOptions = RenderOptions(),
                 ) -> Iterator[tuple[Encoded, dict | None]]:
    """Yield ``({field: (ids, targets)}, record)`` per row; record: see RECORD_FORMATS,
    or ``{"margin"}`` for a preference pair that gives one (else None)."""
    rows = read_rows(path, fmt, field)
    if fmt == "text":
        yield from _encode_text(rows, tokenizer)
        return
    for line_number, row in rows:
        if fmt not in IMAGE_FORMATS and holds_image_parts(row):
            raise DataError(f"data file {path}, line {line_number}: images are read in chat "
                            f"and prompt rows, not yet in {fmt} rows")
        try:
            if fmt == "chat" and (has_images(row["messages"]) or row.get("images")):
                ids, targets, tensors = _vision_chat(tokenizer, row, path, line_number)
                yield {"input": (ids, targets)}, tensors
            elif fmt == "chat":
                yield {"input": render.render_chat(tokenizer, row["messages"])}, None
            elif fmt == "prompt_completion":
                yield {"input": _prompt_completion(tokenizer, row, options)}, None
            elif fmt == "preference":
                margin = row.get("margin")
                yield (render.render_preference(tokenizer, row),
                       None if margin is None else {"margin": margin})
            elif fmt == "unpaired":
                yield (render.render_preference(tokenizer, row, ("completion",)),
                       {"label": row["label"]})
            elif prompt_has_images(row):
                text, ids, tensors, columns = _vision_prompt(tokenizer, row, path, line_number,
                                                             tools)
                yield {"prompt": (ids, None)}, {"prompt_text": text, "columns": columns,
                                                "tensors": tensors}
            else:
                text, ids = render.render_prompt(tokenizer, row, tools, options.chat_template)
                yield {"prompt": (ids, None)}, {"prompt_text": text, "columns": row["columns"]}
        except render.TemplateError as err:
            raise DataError(f"data file {path}, line {line_number}: {err}; add "
                            "{% generation %} markers to the template") from None
        except DataError:
            raise
        except Exception as err:  # a template that fails on this row (e.g. role order)
            raise DataError(f"data file {path}, line {line_number}: the chat template "
                            f"failed: {err}") from None


def _vision_chat(tokenizer: Any, row: dict, path: Path, line_number: int
                 ) -> tuple[list[int], list[int], dict[str, np.ndarray]]:
    """A chat with images: its tokens, targets and image tensors (vision_render.py)."""
    where = f"data file {path}, line {line_number}"
    processor = processor_of(tokenizer)
    if processor is None:
        raise DataError(f"{where}: the row holds images, and the model has no image "
                        "processor (a vision-language model's directory has one)")
    try:
        messages, sources = split_images(row["messages"], row.get("images"))
    except PartsError as err:
        raise DataError(f"{where}: {err}") from None
    images = open_row_images(sources, path.parent, where)
    try:
        return render_vision_chat(processor, messages, images)
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def prompt_has_images(row: dict) -> bool:
    """Whether a validated prompt row holds image parts or an ``images`` column."""
    return holds_image_parts(row["messages"] or []) or bool(row["columns"].get("images"))


def _vision_prompt(tokenizer: Any, row: dict, path: Path, line_number: int,
                   tools: list[dict] | None) -> tuple[str, list[int], dict[str, np.ndarray], dict]:
    """A prompt with images: (its text through the chat template with the generation
    prompt, its token ids with each image's tokens, the processor's image tensors for it
    alone, its other columns). Images of the ``images`` column that no image part takes
    go before the text of the first user turn (a string prompt is one user turn)."""
    where = f"data file {path}, line {line_number}"
    processor = processor_of(tokenizer)
    if processor is None:
        raise DataError(f"{where}: the row holds images, and the model has no image "
                        "processor (a vision-language model's directory has one)")
    columns = dict(row["columns"])
    listed = columns.pop("images", None)
    messages = row["messages"] or [{"role": "user", "content": row["prompt"]}]
    if listed and not holds_image_parts(messages):
        messages = _images_first(messages, len(listed))
    try:
        messages, sources = split_images(messages, listed)
    except PartsError as err:
        raise DataError(f"{where}: {err}") from None
    images = open_row_images(sources, path.parent, where)
    text = render._template(tokenizer, messages, generation_prompt=True, tools=tools)
    try:
        ids, tensors = process_prompt(processor, text, images)
    except ValueError as err:
        raise DataError(f"{where}: the model's processor refused the images: {err}") from None
    return text, ids, tensors, columns


def _images_first(messages: list[dict], count: int) -> list[dict]:
    """``messages`` with ``count`` image parts before the first user turn's text."""
    at = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    content = messages[at]["content"]
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    parts = [{"type": "image"} for _ in range(count)] + text
    return [*messages[:at], {**messages[at], "content": parts}, *messages[at + 1:]]


def _prompt_completion(tokenizer: Any, row: dict,
                       options: RenderOptions) -> tuple[list[int], list[int]]:
    """A prompt and its completion as one sequence: rendered as an unpaired completion is
    (plain text for strings, else a conversation), targets on the completion only unless
    ``completion_only_loss`` is off."""
    ids, targets = render.render_preference(tokenizer, row, ("completion",))["completion"]
    return ids, (targets if options.completion_only_loss else [1] * len(ids))


def _encode_text(rows: Iterator[tuple[int, dict]],
                 tokenizer: Any) -> Iterator[tuple[Encoded, None]]:
    chunk: list[str] = []

    def flush() -> Iterator[tuple[Encoded, None]]:
        for ids in render.render_text(tokenizer, chunk) if chunk else []:
            yield {"input": (ids, None)}, None
        chunk.clear()

    for _, row in rows:
        chunk.append(row["text"])
        if len(chunk) == _TEXT_CHUNK:
            yield from flush()
    yield from flush()


class _RaggedWriter:
    """Appends sequences to ``<name>.tokens.bin`` / ``.targets.bin``; offsets at close."""

    def __init__(self, directory: Path, name: str, with_targets: bool):
        self.directory, self.name = directory, name
        self.tokens = (directory / f"{name}.tokens.bin").open("wb")
        self.targets = (directory / f"{name}.targets.bin").open("wb") if with_targets else None
        self.offsets = [0]

    def append(self, ids: list[int], targets: list[int] | None) -> None:
        self.tokens.write(np.asarray(ids, dtype=np.int32).tobytes())
        if self.targets is not None:
            self.targets.write(np.asarray(targets, dtype=np.uint8).tobytes())
        self.offsets.append(self.offsets[-1] + len(ids))

    def close(self) -> None:
        self.tokens.close()
        if self.targets is not None:
            self.targets.close()
        np.asarray(self.offsets, dtype=np.int64).tofile(self.directory / f"{self.name}.offsets.bin")


def _map(path: Path, dtype: type) -> np.ndarray:
    if path.stat().st_size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def open_entry(entry: Path, source: Path) -> TokenizedSource:
    """Memory-map a complete cache entry."""
    meta = json.loads((entry / "meta.json").read_text())
    fields = {}
    for name in FIELDS[meta["format"]]:
        targets = entry / f"{name}.targets.bin"
        fields[name] = Ragged(tokens=_map(entry / f"{name}.tokens.bin", np.int32),
                              offsets=np.fromfile(entry / f"{name}.offsets.bin", dtype=np.int64),
                              targets=_map(targets, np.uint8) if targets.is_file() else None)
    records = None
    if meta["format"] in RECORD_FORMATS:
        with (entry / "records.jsonl").open(encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
    margins = None
    if meta["format"] == "preference":
        margins = np.fromfile(entry / MARGIN_FILE, dtype=np.float64)
        margins = None if np.isnan(margins).all() else margins
    images = RowTensors(entry / TENSORS_FILE) if (entry / TENSORS_FILE).is_file() else None
    return TokenizedSource(path=source, format=meta["format"], fields=fields, records=records,
                           cache_entry=entry, margins=margins, images=images)
