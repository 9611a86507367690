"""``format: auto``: a source's format recognised from the columns of its first row.

The columns are TRL's (its dataset formats): ``text``; ``messages``; ``prompt`` alone;
``prompt`` + ``completion``; ``chosen`` + ``rejected`` (with or without ``prompt``);
``prompt`` + ``completion`` + ``label``; ``prompt`` + ``completions`` + ``labels``
(stepwise supervision, which no astrai strategy trains). Where the columns fit several
formats, the first one the strategy reads wins: a GRPO run reads ``prompt`` +
``completion`` rows as prompts (the completion a column for the rewards), SFT as
prompt-completion pairs. The run log names the format chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astrai_core.data.config import DEFAULT_CACHE_DIR, STEPWISE_REFUSAL, DataConfig, mixed_batches
from astrai_core.errors import FieldError
from astrai_core.log import get_logger

log = get_logger(__name__)


def candidates(row: dict) -> list[str]:
    """The formats whose columns ``row`` has, the most specific first."""
    keys = set(row)
    if {"completions", "labels"} <= keys:
        return ["stepwise"]
    prompted = "prompt" in keys or "messages" in keys
    found = []
    if {"chosen", "rejected"} <= keys:
        found.append("preference")
    if prompted and {"completion", "label"} <= keys:
        found.append("unpaired")
    if prompted and "completion" in keys and "label" not in keys:
        found.append("prompt_completion")  # labelled completions are not all to be learned
    messages = row.get("messages")
    if "prompt" not in keys and isinstance(messages, list) and messages \
            and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        found.append("chat")
    if prompted:
        found.append("prompt")
    if "text" in keys:
        found.append("text")
    return found


def detect(row: dict, accepted: tuple[str, ...] | None, path: tuple, where: Any) -> str:
    """The format of ``row``: the first candidate in ``accepted`` (any, without it)."""
    found = candidates(row)
    if found == ["stepwise"]:
        raise FieldError(path, STEPWISE_REFUSAL)
    if not found:
        columns = ", ".join(sorted(map(str, row))) or "none"
        raise FieldError(path, f"auto cannot tell the format of {where} from its columns "
                         f"({columns}); name its format, or rename its columns (`columns`) "
                         "to TRL's: text, messages, prompt, completion, chosen, rejected, label")
    fitting = [f for f in found if accepted is None or f in accepted]
    return (fitting or found)[0]


def resolve_auto(data: DataConfig, train: tuple[str, ...] | None,
                 evaluation: tuple[str, ...] | None, base_dir: str | Path | None = None,
                 ) -> DataConfig:
    """``data`` with each ``format: auto`` replaced by the format its first row shows,
    logged once per source. ``train``/``evaluation``: the formats the run reads there
    (None: any)."""
    from astrai_core.data.datasets_io import first_row

    if not _has_auto(data):
        return data
    resolved = data.resolve_paths(base_dir if base_dir is not None else Path.cwd())
    cache_dir = resolved.cache_dir or DEFAULT_CACHE_DIR.resolve()

    def resolve(source: Any, checked: Any, path: tuple, accepted: tuple[str, ...] | None) -> Any:
        if source.format != "auto":
            return source
        field = ".".join(map(str, path))
        row = first_row(checked, cache_dir, f"{field}.path")
        fmt = detect(row, accepted, path + ("format",), checked.path)
        log.info(f"{field}: format auto -> {fmt} (columns {', '.join(map(str, row))})",
                 source=str(checked.path), format=fmt)
        return source.model_copy(update={"format": fmt})

    sources = [resolve(s, c, ("data", "sources", i), train)
               for i, (s, c) in enumerate(zip(data.sources, resolved.sources))]
    eval_source = (resolve(data.eval, resolved.eval, ("data", "eval"), evaluation)
                   if data.eval is not None else None)
    eval_sets = [resolve(s, c, ("data", "eval_sets", i), evaluation)
                 for i, (s, c) in enumerate(zip(data.eval_sets, resolved.eval_sets))]
    problem = mixed_batches([s.format for s in sources])
    if problem:
        raise FieldError(("data", "sources"), problem)
    return data.model_copy(update={"sources": sources, "eval": eval_source,
                                   "eval_sets": eval_sets})


def _has_auto(data: DataConfig) -> bool:
    return any(s is not None and s.format == "auto"
               for s in (*data.sources, data.eval, *data.eval_sets))
