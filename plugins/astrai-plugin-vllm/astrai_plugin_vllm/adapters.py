"""Serving peft LoRA adapters from one vLLM engine on their base (vLLM's ``enable_lora``).

Each adapter directory becomes a ``LoRARequest`` whose integer id stays the same for as
long as the directory's files do, so vLLM keeps the adapter loaded between requests
(at most ``max_loras`` of them, least recently used out). A directory written again in
place (the same path, new files) gets a new id: vLLM caches an adapter by id and would
otherwise go on serving the old weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# the ranks vLLM 0.32 sizes its LoRA buffers for (vllm.config.lora.MaxLoRARanks)
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
WEIGHTS_FILE = "adapter_model.safetensors"


def lora_engine_args(max_adapters: int, max_rank: int) -> dict[str, Any]:
    """vllm.LLM's arguments for serving up to ``max_adapters`` adapters of rank <= ``max_rank``
    (none: 0 adapters)."""
    if max_adapters < 1:
        return {}
    fitting = [rank for rank in VLLM_RANKS if rank >= max_rank]
    if not fitting:
        raise ValueError(f"adapter rank {max_rank}: vLLM serves ranks up to {VLLM_RANKS[-1]}")
    return {"enable_lora": True, "max_loras": max_adapters, "max_lora_rank": fitting[0]}


class AdapterRequests:
    """The ``LoRARequest`` of each adapter directory, its id stable per directory."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, tuple[int, ...]]] = {}  # path -> (id, _stamp)
        self._next = 1  # vLLM's ids start at 1

    def request(self, engine: Any, directory: str | Path | None, images: Any = None) -> Any:
        """The request for ``directory`` (None: the bare base, no request); prompts with
        ``images`` take no adapter."""
        if directory is None:
            return None
        if images is not None:
            raise ValueError("generate(adapter=...) takes prompts without images")
        from vllm.lora.request import LoRARequest

        path = str(Path(directory).resolve())
        stamp = _stamp(Path(path, WEIGHTS_FILE))
        known = self._ids.get(path)
        if known is None or known[1] != stamp:
            if known is not None:  # rewritten in place: drop the stale copy from the engine
                engine.llm_engine.remove_lora(known[0])
            known = self._ids[path] = (self._next, stamp)
            self._next += 1
        return LoRARequest(f"adapter-{known[0]}", known[0], path)


def _stamp(weights: Path) -> tuple[int, ...]:
    """What changes when the file is written again (a new file, renamed in place)."""
    info = weights.stat()
    return info.st_ino, info.st_mtime_ns, info.st_size
