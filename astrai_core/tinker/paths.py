"""``tinker://`` paths and the engine's state-dir keys they name.

A key is ``<model_id>/<weights|sampler_weights>/<name>``; its path is ``tinker://<key>``.
Every part is checked so that no path can name anything outside the state dir.
"""

from __future__ import annotations

import re

from astrai_core.tinker.engine_types import EngineRequestError

SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")
_MODEL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}:train:[0-9]{1,9}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_name(name: str) -> str:
    """A checkpoint name: letters, digits, ``_ . -``, not starting with a dot (no ``..``, no ``/``)."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise EngineRequestError(f"checkpoint name {name!r}: use letters, digits, '_', '.' and '-' "
                                 "(at most 128, not starting with '.')")
    return name


def key_for(model_id: str, kind: str, name: str) -> str:
    return f"{model_id}/{kind}/{check_name(name)}"


def path_for(key: str) -> str:
    return SCHEME + key


def key_of(path: str) -> str:
    """The state-dir key of ``tinker://<model_id>/<kind>/<name>``; anything else is a 400."""
    if not path.startswith(SCHEME):
        raise EngineRequestError(f"path {path!r}: expected tinker://<model_id>/<weights|sampler_weights>/<name>")
    parts = path[len(SCHEME):].split("/")
    if len(parts) != 3 or not _MODEL_ID.fullmatch(parts[0]) or parts[1] not in KINDS:
        raise EngineRequestError(f"path {path!r}: expected tinker://<model_id>/<weights|sampler_weights>/<name>")
    return key_for(parts[0], parts[1], parts[2])


def kind_of(key: str) -> str:
    return key.split("/")[1]
