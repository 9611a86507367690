"""Completion lengths forced from a seeded plan, in whichever process runs the torch sampler.

:func:`install` patches ``astrai_core.sampling.torch_sampler`` (its ``choose`` and
``TorchSampler.generate``) in the calling process: every new sequence takes the next
length of one seeded stream (:func:`bench_rl_longtail.length_schedule`), a carried
sequence (a request that is its prompt plus the tokens it already has, as partial
rollouts send it) keeps its own, and :func:`bench_rl_longtail.force_lengths` ends each
completion exactly there. A completion that comes back unfinished, ``length`` (its
segment ended) or ``abort`` (an interrupted generate call), is carried.

With the ray sampler the torch sampler runs in a Ray worker, another process: there
:func:`worker_setup` is Ray's ``worker_process_setup_hook`` (:func:`ray_runtime_env`
builds the ``runtime_env`` that names it), so the plan's state lives in the worker.
After every generate call the patched process writes a report (its pid, torch threads,
calls, sequences planned, finished at their target or not, carried, the seconds spent
generating and, of those, prefilling, with the positions prefilled and how many of them
were tokens rather than padding): the bench reads it to check that the forcing acted
where the sampling happened, and to profile the sampling.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENV = "ASTRAI_BENCH_FORCED_LENGTHS"  # the JSON settings the Ray worker's hook reads
UNFINISHED = ("length", "abort")  # a segment's end, an interrupted call: both carry on


def planned(max_tokens: int) -> list[int]:
    """The seeded stream of lengths, in the order new sequences take them."""
    from bench_rl_longtail import length_schedule

    return [x for row in length_schedule(200, 64, max_tokens) for x in row]


class Lengths:
    """Each new sequence's target length from one seeded stream; a carried sequence (its
    request is its prompt plus the tokens it already has) keeps its own."""

    def __init__(self, max_tokens: int) -> None:
        self.stream = iter(planned(max_tokens))
        # prefix -> (target, tokens already sampled), first in first out: sequences with
        # the same prefix (an aborted group before its first token) each keep their own
        self.carried: dict[tuple[int, ...], deque[tuple[int, int]]] = defaultdict(deque)
        self.stats = {"calls": 0, "planned": 0, "new": 0, "at_target": 0, "off_target": 0,
                      "carried": 0, "aborted": 0, "generate_seconds": 0.0,
                      "prefill_seconds": 0.0, "prefill_positions": 0, "prefill_tokens": 0}

    def for_requests(self, prompts: list[list[int]], counts: list[int]) -> list[tuple[int, int]]:
        out = []
        for prompt, count in zip(prompts, counts, strict=True):
            for _ in range(count):
                waiting = self.carried.get(tuple(prompt))
                if waiting:
                    out.append(waiting.popleft())
                else:
                    out.append((next(self.stream), 0))
                    self.stats["new"] += 1
        self.stats["planned"] += len(out)
        return out

    def carry(self, prompts: list[list[int]], completions: list,
              plan: list[tuple[int, int]]) -> None:
        for completion, (target, done) in zip(completions, plan, strict=True):
            total = done + len(completion.token_ids)
            self.stats["aborted"] += completion.finish_reason == "abort"
            if completion.finish_reason in UNFINISHED and total < target:
                prompt = prompts[completion.prompt_index]
                self.carried[tuple(prompt) + tuple(completion.token_ids)].append((target, total))
                self.stats["carried"] += 1
            else:  # finished: exactly at its target when the forcing acted
                self.stats["at_target" if total == target else "off_target"] += 1


def install(max_tokens: int, eos: int, report: str | None = None) -> Lengths:
    """Patch this process's torch sampler to force the planned lengths (see the module
    docstring); with ``report``, write the plan's statistics there after every call."""
    from bench_rl_longtail import force_lengths

    from astrai_core.sampling import prefill as prefill_module
    from astrai_core.sampling import torch_sampler

    plain_choose, plain_generate = torch_sampler.choose, torch_sampler.TorchSampler.generate
    plain_prefill = torch_sampler._DecodeBatch._prefill
    lengths, plan = Lengths(max_tokens), []

    def choose(rows, sampling, logits):  # both decoders (one batch, continuous) call it
        forced = force_lengths(logits, [plan[r.index][1] + len(r.token_ids) for r in rows],
                               [plan[r.index][0] for r in rows], eos)
        return plain_choose(rows, sampling, forced)

    @functools.wraps(plain_generate)  # the sampler's signature, `interrupt` included
    def generate(self, prompts, params, *positional, **kwargs):
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        prompts = [list(p) for p in prompts]
        plan[:] = lengths.for_requests(prompts, [p.n for p in per_prompt])
        start = time.perf_counter()
        out = plain_generate(self, prompts, params, *positional, **kwargs)
        lengths.stats["generate_seconds"] += time.perf_counter() - start
        lengths.stats["calls"] += 1
        lengths.carry(prompts, out, list(plan))
        if report:
            _write_report(Path(report), lengths.stats)
        return out

    def prefill(self, *positional, **kwargs):  # the one-batch decoder's, padded or ragged
        start = time.perf_counter()
        try:
            return plain_prefill(self, *positional, **kwargs)
        finally:
            lengths.stats["prefill_seconds"] += time.perf_counter() - start

    def counted(chunked):  # every prefill forward's positions, and the tokens among them
        def chunked_prefill(model, input_ids, cache, **kwargs):
            mask = kwargs.get("attention_mask")
            lengths.stats["prefill_positions"] += input_ids.numel()
            lengths.stats["prefill_tokens"] += input_ids.numel() if mask is None else int(mask.sum())
            return chunked(model, input_ids, cache, **kwargs)
        return chunked_prefill

    torch_sampler.choose = choose
    torch_sampler._DecodeBatch._prefill = prefill
    torch_sampler.chunked_prefill = counted(torch_sampler.chunked_prefill)
    prefill_module.chunked_prefill = counted(prefill_module.chunked_prefill)
    torch_sampler.TorchSampler.generate = generate
    return lengths


def _write_report(path: Path, stats: dict[str, Any]) -> None:
    import torch

    aside = path.with_name(path.name + ".tmp")
    aside.write_text(json.dumps({**stats, "pid": os.getpid(), "threads": torch.get_num_threads()}))
    aside.replace(path)


def read_report(path: Path) -> dict[str, Any]:
    """The plan's statistics from the process that sampled; an error when the forcing
    never ran there, or a finished completion missed its target."""
    if not path.exists():
        raise SystemExit(f"no length-plan report at {path}: the forcing never ran where the "
                         "sampler generated, so the lengths were not the planned ones")
    stats = json.loads(path.read_text())
    if stats["off_target"] or not stats["at_target"]:
        raise SystemExit(f"the length plan did not act: {stats}")
    return stats


# ---------------------------------------------------------------------- in a Ray worker
def ray_runtime_env(max_tokens: int, eos: int, report: Path, threads: int = 1) -> dict[str, Any]:
    """Ray's ``runtime_env`` whose workers run :func:`worker_setup` at start."""
    settings = {"max_tokens": max_tokens, "eos": eos, "report": str(report), "threads": threads}
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    # (the ray sampler adds the plugin selection, ASTRAI_PLUGINS, to these itself)
    env = {ENV: json.dumps(settings), "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}
    return {"env_vars": env, "worker_process_setup_hook": f"{Path(__file__).stem}.worker_setup"}


def worker_setup() -> None:
    """Ray's worker_process_setup_hook: the settings come from the ``ENV`` variable."""
    import torch

    settings = json.loads(os.environ[ENV])
    torch.set_num_threads(settings["threads"])
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    install(settings["max_tokens"], settings["eos"], settings["report"])
