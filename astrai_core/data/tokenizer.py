"""Load a tokenizer from a model directory; fingerprint it for the data cache."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

from astrai_core.data.processors import load_image_processor
from astrai_core.errors import DataError

# Any one of these means the directory holds a tokenizer vocabulary. The full list of
# tokenizer files, and copying them into checkpoints, live with the checkpoint code:
# astrai_core.checkpoints.native_files.TOKENIZER_FILES / copy_tokenizer_files.
_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def load_tokenizer(directory: str | Path) -> Any:
    """Load the tokenizer stored in ``directory`` with ``transformers.AutoTokenizer``.

    Never runs remote code. Raises DataError when the directory has no tokenizer files
    (AutoTokenizer would otherwise fail obscurely or return an empty tokenizer).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"tokenizer directory not found: {directory}")
    if not any((directory / name).is_file() for name in _VOCAB_FILES):
        raise DataError(f"no tokenizer files in {directory} (expected one of "
                        f"{', '.join(_VOCAB_FILES)})")
    from transformers import AutoTokenizer

    try:
        with warnings.catch_warnings():
            # AutoTokenizer also parses config.json, which in a native checkpoint is an
            # astrai config: transformers' complaints about its fields are not the user's.
            warnings.simplefilter("ignore", FutureWarning)
            tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot load the tokenizer in {directory}: {err}") from None
    if len(tokenizer) == 0:
        raise DataError(f"the tokenizer in {directory} has an empty vocabulary")
    processor = load_image_processor(directory)
    if processor is not None:  # chats with images are rendered through it (vision_render.py)
        tokenizer.astrai_processor = processor
    return tokenizer


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything that decides how ``tokenizer`` turns text into ids.

    Built from the tokenizer itself (its serialized vocabulary and pipeline, special
    tokens and chat template), so it also works for tokenizers built in memory.
    """
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:  # a slow tokenizer: hash its files
        directory = Path(getattr(tokenizer, "name_or_path", "") or ".")
        for name in (*_VOCAB_FILES, "merges.txt", "tokenizer_config.json"):
            if (directory / name).is_file():
                digest.update(name.encode() + (directory / name).read_bytes())
        digest.update(repr(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(type(tokenizer).__name__.encode())
    digest.update(repr(sorted(tokenizer.special_tokens_map.items())).encode())
    digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    return digest.hexdigest()
