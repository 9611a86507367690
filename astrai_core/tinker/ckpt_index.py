"""What each saved checkpoint was trained on: its base model and LoRA shape.

A client may start a new training model from a checkpoint (``create_training_client_
from_state``) on a server started later; the request names only the path, so the base
model and the adapter's rank are looked up here. One small JSON file per checkpoint
under ``<state_dir>/.tinker-index/``, written aside and renamed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from astrai_core.tinker.engine_types import LoraSpec


class CheckpointIndex:
    def __init__(self, state_dir: Path | None) -> None:
        self._root = None if state_dir is None else Path(state_dir) / ".tinker-index"
        self._known: dict[str, tuple[str, LoraSpec]] = {}

    def record(self, key: str, base_model: str, lora: LoraSpec) -> None:
        self._known[key] = (base_model, lora)
        if self._root is None:
            return
        path = self._root / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(path.name + ".tmp")
        aside.write_text(json.dumps({"base_model": base_model, "lora": dataclasses.asdict(lora)}))
        os.replace(aside, path)

    def lookup(self, key: str) -> tuple[str, LoraSpec] | None:
        if key in self._known:
            return self._known[key]
        if self._root is None or not (path := self._root / f"{key}.json").is_file():
            return None
        try:
            saved = json.loads(path.read_text())
            found = (str(saved["base_model"]), LoraSpec(**saved["lora"]))
        except (ValueError, KeyError, TypeError):
            return None
        self._known[key] = found
        return found
