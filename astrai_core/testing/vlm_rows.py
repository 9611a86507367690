"""Preference and unpaired rows with images for tiny vision-language model runs, and
transformers' own inputs for them (an independent reference for strategies' tests).

Row i asks "<image>i+1=?" about :func:`~astrai_core.testing.hf_vlms.tiny_image` ``(i)``,
given in one of the shapes a prompt may hold it (rotating by row: a relative path in
OpenAI's ``image_url`` part, an entry of the row's ``images`` list, a data: URL,
datasets' ``{"bytes": ...}``). Imports PIL; nothing is downloaded.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from astrai_core.testing.hf_vlms import TINY_VLM_FAMILIES, tiny_image, write_vlm_dir


def write_vlm_dirs(root: Path) -> dict[str, Path]:
    """A tiny model directory of every family of :data:`TINY_VLM_FAMILIES`, by family."""
    return {family: write_vlm_dir(Path(root) / family, family) for family in TINY_VLM_FAMILIES}


def image_part(directory: Path, i: int) -> tuple[dict, dict]:
    """(row i's image part, the row's extra fields), its PNG written to ``directory``."""
    tiny_image(i).save(directory / f"{i}.png")
    if i % 4 == 0:
        return {"type": "image_url", "image_url": {"url": f"{i}.png"}}, {}
    if i % 4 == 1:
        return {"type": "image"}, {"images": [f"{i}.png"]}
    buffer = io.BytesIO()
    tiny_image(i).save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    if i % 4 == 2:
        return {"type": "image", "image": "data:image/png;base64," + encoded}, {}
    return {"type": "image", "image": {"bytes": encoded, "path": None}}, {}


def write_image_pairs(directory: Path, rows: int = 4, unpaired: bool = False) -> Path:
    """``pairs.jsonl`` in ``directory``: row i's prompt, chosen ``i+1``, rejected ``i+2``;
    ``unpaired``: ``unpaired.jsonl``, one completion per row (``i+1`` labelled true on
    even rows, ``i+2`` labelled false on odd rows)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(rows):
        part, extra = image_part(directory, i)
        prompt = [{"role": "user", "content": [part, {"type": "text", "text": f"{i}+1=?"}]}]
        if unpaired:
            row = {"prompt": prompt, "completion": str(i + 1 + i % 2), "label": i % 2 == 0}
        else:
            row = {"prompt": prompt, "chosen": str(i + 1), "rejected": str(i + 2)}
        lines.append(json.dumps({**row, **extra}))
    path = directory / ("unpaired.jsonl" if unpaired else "pairs.jsonl")
    path.write_text("\n".join(lines) + "\n")
    return path


def image_chat(i: int, answer: str | None = None) -> list[dict]:
    """Row i's chat as transformers' chat templates take it (``{"type": "image"}``),
    with the assistant's ``answer`` when given."""
    user = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": f"{i}+1=?"}]}]
    return user + ([{"role": "assistant", "content": answer}] if answer is not None else [])


def transformers_inputs(processor: Any, i: int, answer: str | None = None) -> Any:
    """The processor's own tensors for row i's chat (the generation prompt without an
    answer)."""
    text = processor.apply_chat_template(image_chat(i, answer), tokenize=False,
                                         add_generation_prompt=answer is None)
    return processor(text=[text], images=[[tiny_image(i)]], return_tensors="pt")


def vlm_run_config(tmp_path: Path, model: Path, data: Path, strategy: dict, *,
                   data_format: str = "preference", steps: int = 2, batch_size: int = 4
                   ) -> dict[str, Any]:
    """A CPU run config (a plain dict) training ``model`` on ``data`` for ``steps``."""
    return {"output_dir": str(Path(tmp_path) / "run"), "model": {"path": str(model)},
            "data": {"sources": [{"path": str(data), "format": data_format}], "seq_len": 64,
                     "batch_size": batch_size, "shuffle": False,
                     "cache_dir": str(Path(tmp_path) / "cache")},
            "strategy": strategy, "device": {"name": "cpu"},
            "trainer": {"max_steps": steps, "lr": 1e-2, "warmup_steps": 0, "save_every": steps,
                        "eval_every": 0, "eval_at_start": False, "threads": 1,
                        "progress": False}}
