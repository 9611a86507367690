"""What ``model.path`` names, and which backend runs it (``model.backend``).

``model.path`` may be a native astrai checkpoint, a Hugging Face checkpoint directory, or
a hub id (``Qwen/Qwen3-0.6B``) found through ``huggingface_hub``'s cache. :func:`describe`
answers, reading JSON only (cheap enough for the run plan), what the path is and which
backend runs it:

- ``native``: astrai's own decoder. A native checkpoint always; a Hugging Face directory
  whose ``model_type`` has an importer that accepts its config, imported on the fly into
  a cache (:mod:`astrai_core.checkpoints.import_cache`), the same files as ``astrai import``;
- ``transformers``: any ``AutoModelForCausalLM`` (or vision-language
  ``AutoModelForImageTextToText``) in a Hugging Face directory, wrapped to
  the native model's interface (:mod:`astrai_core.model_backends`).

The default is native where an importer exists and accepts the config, else transformers.
Every problem is a :class:`~astrai_core.errors.FieldError` naming ``model.path`` or
``model.backend``, so the plan prints it as one line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai_core.errors import AstraiError, FieldError

NATIVE, TRANSFORMERS = "native", "transformers"
BACKENDS = (NATIVE, TRANSFORMERS)
PATH: tuple[str, ...] = ("model", "path")
BACKEND: tuple[str, ...] = ("model", "backend")
# The files a run reads from a hub repository: never pickled weights (*.bin, *.pt).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken", "*.py"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelSource:
    """``model.path`` resolved: a local ``directory`` and how to load it."""

    given: str                    # model.path as written
    directory: Path               # the native checkpoint or Hugging Face directory
    native_checkpoint: bool       # an astrai checkpoint (no import needed)
    backend: str                  # native | transformers
    model_type: str | None        # a Hugging Face directory's model_type
    importer: str | None = None   # the importer of an on-the-fly import (native backend)

    @property
    def imports(self) -> bool:
        """A Hugging Face directory run natively: imported (once, cached) before loading."""
        return self.backend == NATIVE and not self.native_checkpoint


def describe(path: str, backend: str | None, registry: Any,
             trust_remote_code: bool = False) -> ModelSource:
    """``model.path`` and ``model.backend`` checked and resolved (a hub id is found in the
    cache, or downloaded when the hub is reachable); for the transformers backend, that
    transformers can build the model (``trust_remote_code``: code the directory ships)."""
    from astrai_core.checkpoints.hf.files import read_json

    directory = locate(path)
    if not (directory / "config.json").is_file():
        raise FieldError(PATH, f"{directory} has no config.json: neither an astrai checkpoint "
                         "nor a Hugging Face checkpoint directory")
    try:
        config = read_json(directory / "config.json")
    except AstraiError as exc:
        raise FieldError(PATH, str(exc)) from None
    if config.get("format") == "astrai":
        if backend == TRANSFORMERS:
            raise FieldError(BACKEND, f"transformers runs Hugging Face directories, and "
                             f"{path!r} is an astrai checkpoint (write one with `astrai export "
                             f"{path} OUT`), or leave model.backend out to run it natively")
        return ModelSource(path, directory, True, NATIVE, None)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise FieldError(PATH, f"{directory / 'config.json'} has no model_type: not a "
                         "Hugging Face causal LM directory")
    importer, why_not = native_importer(registry, config)
    if backend == NATIVE and importer is None:
        raise FieldError(BACKEND, f"native: {why_not}; use model.backend: transformers (the "
                         f"default for {model_type!r})")
    chosen = backend or (NATIVE if importer is not None else TRANSFORMERS)
    if chosen == TRANSFORMERS:
        check_transformers_can_build(config, trust_remote_code)
    return ModelSource(path, directory, False, chosen, model_type,
                       importer if chosen == NATIVE else None)


def check_transformers_can_build(hf_config: dict[str, Any], trust_remote_code: bool) -> None:
    """transformers has a causal LM class (or, for a vision-language config, an
    image-text-to-text class) for the config's model_type, or the directory ships one
    (``auto_map``) and ``model.trust_remote_code`` lets it run."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    from astrai_core.model_backends.vision import is_vision_language

    model_type = hf_config["model_type"]
    known = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if is_vision_language(hf_config) \
        else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type in known:
        return
    auto = "AutoModelForImageTextToText" if is_vision_language(hf_config) \
        else "AutoModelForCausalLM"
    if auto in (hf_config.get("auto_map") or {}):
        if not trust_remote_code:
            raise FieldError(("model", "trust_remote_code"), f"model_type {model_type!r} "
                             "runs only with the model code its directory ships (auto_map); "
                             "set model.trust_remote_code: true to run that code, with your "
                             "rights, if you trust its source")
        return
    raise FieldError(PATH, f"model_type {model_type!r} is not a causal LM that transformers "
                     f"{transformers.__version__} knows ({auto}), and its "
                     "directory ships no model code")


def native_importer(registry: Any, hf_config: dict[str, Any]) -> tuple[str | None, str]:
    """(the name of the importer that takes this Hugging Face config, or None and why not)."""
    from astrai_core.checkpoints.hf.select import importer_spec_for

    model_type = hf_config["model_type"]
    try:
        spec = importer_spec_for(registry, model_type)
        spec.load()().config_from_hf(hf_config)
    except AstraiError as exc:
        return None, f"model_type {model_type!r} has no native importer that takes it ({exc})"
    return spec.name, ""


def locate(path: str) -> Path:
    """A local directory, or a hub id's snapshot in the Hugging Face cache (downloaded
    first when the hub is reachable and ``HF_HUB_OFFLINE`` is not set)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists() or not looks_like_repo_id(path):
        what = "is not a directory" if local.exists() else "does not exist"
        raise FieldError(PATH, f"{path!r} {what} (nor is it a Hugging Face hub id)")
    return hub_snapshot(path)


def looks_like_repo_id(path: str) -> bool:
    """``name`` or ``owner/name``, as the hub spells repository ids (never ``./x``, ``/x``)."""
    return bool(_REPO_ID.match(path)) and ".." not in path and not path.endswith(".")


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of ``repo_id``: one error line naming the id, ``HF_HUB_OFFLINE``
    and the cache directory when it cannot be had."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    from astrai_core.data.hub import hub_reachable, offline_by_environment

    offline, cache = offline_by_environment(), hub_cache()
    unreachable = not offline and not hub_reachable()  # no back-off retries: the cache only
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, cache_dir=cache,
                                      local_files_only=offline or unreachable))
    except GatedRepoError:
        raise FieldError(PATH, f"hub model {repo_id!r} is gated: accept its terms on the hub "
                         "and log in (`hf auth login`), or point model.path at a local "
                         "directory") from None
    except RepositoryNotFoundError:
        raise FieldError(PATH, f"{repo_id!r} is neither a directory nor a model on the "
                         "Hugging Face hub") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        state = "HF_HUB_OFFLINE=1" if offline else (
            f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}, and the hub was "
            f"unreachable ({'no answer to a probe' if unreachable else type(exc).__name__})")
        raise FieldError(PATH, f"{repo_id!r} is not a local directory and not in the Hugging "
                         f"Face cache {cache} ({state}): download it while online "
                         f"(`hf download {repo_id}`) or point model.path at its "
                         "directory") from None


def hub_cache() -> str:
    """The Hugging Face hub cache directory as the environment says now."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return constants.HF_HUB_CACHE


def model_directory(source: ModelSource, registry: Any,
                    cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory the model loads from: ``source.directory``, or for a Hugging Face
    directory run natively its import in the cache (imported now if it is not there)."""
    if not source.imports:
        return source.directory
    from astrai_core.checkpoints.hf.select import load_importer
    from astrai_core.checkpoints.import_cache import cache_root, cached_import

    importer = load_importer(registry, name=source.importer)
    return cached_import(source.directory, source.model_type or "", importer,
                         cache_root(cache_dir))
