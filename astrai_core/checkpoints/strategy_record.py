"""``strategy.json``: the strategy whose checkpoint a directory is.

Every training checkpoint records the strategy that trained it. Most checkpoints are a
causal LM and export as one; a strategy whose checkpoints hold more (the ``rm``
strategy's score head) names an exporter in its spec
(:attr:`~astrai_core.plugins.specs.StrategySpec.exporter`), and `astrai export` hands such
a checkpoint to it rather than writing the causal LM alone. A plugin that writes such
checkpoints by other means (an import) records its strategy too. JSON: reading it runs
no code.
"""

from __future__ import annotations

import json
from pathlib import Path

from astrai_core.errors import CheckpointError

STRATEGY_FILE = "strategy.json"


def write_strategy_record(directory: str | Path, strategy: str) -> Path:
    """Record ``strategy`` in ``directory`` (a staging directory: its manifest comes after)."""
    path = Path(directory) / STRATEGY_FILE
    path.write_text(json.dumps({"strategy": strategy}, indent=2) + "\n", encoding="utf-8")
    return path


def read_strategy_record(directory: str | Path) -> str | None:
    """The strategy ``directory`` records; None when it records none (a model saved
    outside training, or a checkpoint of an older astrai)."""
    path = Path(directory) / STRATEGY_FILE
    if not path.is_file():
        return None
    try:
        strategy = json.loads(path.read_text(encoding="utf-8"))["strategy"]
    except (ValueError, KeyError, TypeError):
        strategy = None
    if not isinstance(strategy, str):
        raise CheckpointError(f"{path} must hold {{\"strategy\": NAME}}")
    return strategy
