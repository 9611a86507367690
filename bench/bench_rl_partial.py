"""Partial rollouts vs synchronous rollouts on the long-tailed GRPO workload, on CPU.

The workload of bench_rl_longtail.py (the same model, prompts, reward and length
distribution: 90% of completions uniform in [4, 63] tokens, 10% in [64, 512], forced by
the same logits processor), trained by astrai with packed micro-batches, each peer in a
fresh process:

- ``sync``: every rollout step waits for its longest completion;
- ``partial``: ``rollout.partial: true`` (``max_staleness``, ``partial_tokens`` below): a
  step trains on the groups that finished and carries the others to later steps;
- ``stale1`` (``--sampler ray`` only): synchronous rollouts requested one step ahead
  (``rollout.max_staleness: 1``, the sampler's log-probs as PPO's old ones), the
  sampler generating while the trainer steps.

``--sampler torch`` samples in the trainer's process. ``--sampler ray`` samples in one
Ray worker (``sampler: {name: ray, workers: 1, worker_resources: {CPU: 1}}``, a local Ray
started by the run) running the torch sampler with one thread: one core for the trainer,
one for the worker.

Each completion's length is drawn once, in the order its sequence enters the sampler,
from one seeded stream shared by all peers; a carried sequence keeps its length across
segments (``forced_lengths.py``). The forcing runs where the sampler runs: in the
trainer's process, or in the Ray worker through Ray's ``worker_process_setup_hook``, and
the bench stops with an error unless that process (the worker's, not the trainer's, with
Ray) reports every finished completion at its planned length, and, for ``sync`` and
``stale1``, unless every step trained exactly the planned lengths. ``--max-tokens`` is at
least 64 (the long completions take [64, max]).

Reported per peer: seconds per step (median) and trained completion tokens per second
(over all steps; tokens masked for staleness are not counted), the first step of every
run left out; the stale-masked fraction of the trained tokens; the share of the whole
run's step time the sampler spent generating (``sampler busy``) and the trainer spent
waiting for rollouts (``trainer waiting``; the rest is the trainer's own work); how many
completions the sampling process finished at their planned length, and how many an
interrupted generate call returned unfinished (``abort``: carried like a segment's end);
and each peer's throughput over ``sync``'s. With ``--sampler ray`` the ceiling of any
overlap comes from
``sync``'s own steps: S the seconds a step waits for its rollout, T the rest of it, and
no overlap can beat (S + T) / max(S, T) its throughput; each overlapped peer's speed-up
is also given as a fraction of that ceiling. A profile per step follows (means over the
steps): the trainer's wait, weight push and own work; the sampling process's seconds
generating and prefilling, the positions it prefilled (and how many were tokens, not
padding), and its generate calls.

    .venv/bin/python bench/bench_rl_partial.py [--sampler torch|ray] [--steps 8]
        [--prompts 4] [--group 8] [--max-tokens 512] [--staleness 2]
        [--partial-tokens 64] [--rounds 1] [--peers sync,partial,stale1]

``make bench`` runs it with both samplers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_trl import add_run_arguments, child_json, make_model, train_astrai  # noqa: E402
from forced_lengths import install, planned, ray_runtime_env, read_report  # noqa: E402

PEERS = {"torch": ("sync", "partial"), "ray": ("sync", "partial", "stale1")}
# the importance weight of tokens sampled by an older policy (partial, stale1)
CORRECTION = {"rollout_correction": {"level": "token", "mode": "truncate", "threshold": 2.0}}


def peer_overrides(who: str, args: argparse.Namespace) -> dict:
    """The config sections that make ``who`` (packed micro-batches for all)."""
    overrides: dict = {"trainer": {"micro_batch_tokens": 4096}}
    if who == "partial":
        overrides["rollout"] = {"partial": True, "max_staleness": args.staleness,
                                "partial_tokens": args.partial_tokens}
        overrides["strategy"] = CORRECTION
    elif who == "stale1":  # PPO's old log-probs are the sampler's: no extra forward
        overrides["rollout"] = {"max_staleness": 1}
        overrides["strategy"] = {"recompute_old_logprobs": False}
    return overrides


def sampler_section(who: str, args: argparse.Namespace, eos: int, report: Path) -> dict:
    """The sampler: one decode batch of every sequence in flight (partial keeps twice a
    rollout's groups going, and the caches of the sequences a segment left unfinished),
    in this process or in one Ray worker."""
    rows = args.prompts * args.group * (2 if who == "partial" else 1)
    engine = {"max_batch_size": rows}
    if who == "partial":  # a segment continued under the same weights recomputes nothing
        engine["keep_unfinished"] = True
    if args.sampler == "torch":
        return {"max_new_tokens": args.max_tokens, **engine}
    return {"name": "ray", "workers": 1, "worker_resources": {"CPU": 1},
            "max_new_tokens": args.max_tokens,
            "worker_sampler": {"name": "torch", **engine},
            "init_kwargs": {"runtime_env": ray_runtime_env(args.max_tokens, eos, report,
                                                           args.threads or 1),
                            "object_store_memory": 256 * 2**20}}


def time_astrai(model_dir: Path, work: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(model_dir)).eos_token_id
    report = work / "lengths.json"
    if args.sampler == "torch":
        install(args.max_tokens, eos, str(report))
    waits = time_waits(args.sampler)
    step_waits = per_step(waits)
    records = train_astrai(model_dir, work, args, sampler_section(args.only, args, eos, report),
                           peer_overrides(args.only, args))
    steps = [r for r in records if "time/step_seconds" in r]
    rows = args.prompts * args.group  # trained per step
    plan = read_report(report)
    if args.sampler == "ray" and plan["pid"] == os.getpid():
        raise SystemExit("the lengths were forced in the trainer's process, not the Ray worker's")
    if args.only != "partial":  # rollout k holds the k-th run of planned lengths, in order
        check_trained_lengths([r["rollout/response_length_mean"] for r in steps], rows,
                              args.max_tokens)
    return {"seconds": [r["time/step_seconds"] for r in steps],
            "tokens": [r["rollout/response_length_mean"] * rows for r in steps],
            "masked": [r.get("rollout/stale_masked_fraction", 0.0) for r in steps],
            "wait": step_waits[:len(steps)],
            "push": [r.get("rollout/weight_push_wait_seconds", 0.0) for r in steps],
            "plan": plan}


def time_waits(sampler: str) -> list[float]:
    """The seconds the trainer spends waiting on the sampler (``[total]``, growing): the
    torch sampler's generate calls, or the ray sampler's rollouts from request to result
    minus the time until ``.result()`` is asked for (a rollout requested ahead)."""
    waits = [0.0]
    if sampler == "torch":
        from astrai_core.sampling.torch_sampler import TorchSampler as Sampler

        plain = Sampler.generate

        def generate(self, *positional, **kwargs):
            start = time.perf_counter()
            try:
                return plain(self, *positional, **kwargs)
            finally:
                waits[0] += time.perf_counter() - start

        Sampler.generate = generate
        return waits
    from astrai_plugin_ray.sampler import RaySampler

    plain_async = RaySampler.generate_async

    def generate_async(self, *positional, **kwargs):
        handle = plain_async(self, *positional, **kwargs)
        result = handle.result

        def timed_result():
            start = time.perf_counter()
            try:
                return result()
            finally:
                waits[0] += time.perf_counter() - start

        handle.result = timed_result
        return handle

    RaySampler.generate_async = generate_async
    return waits


def per_step(waits: list[float]) -> list[float]:
    """The trainer's seconds waiting on the sampler in each optimizer step (a list that
    fills as the run steps), from the growing total ``waits``."""
    from astrai_core.training.trainer import Trainer

    plain, steps = Trainer._one_step, []

    def one_step(self, *positional, **kwargs):
        before = waits[0]
        try:
            return plain(self, *positional, **kwargs)
        finally:
            steps.append(waits[0] - before)

    Trainer._one_step = one_step
    return steps


def check_trained_lengths(means: list[float], rows: int, max_tokens: int) -> None:
    """A synchronous run trains exactly the planned lengths: else the forcing missed."""
    stream = planned(max_tokens)
    expected = [statistics.mean(stream[k * rows:(k + 1) * rows]) for k in range(len(means))]
    if any(abs(m - e) > 1e-6 for m, e in zip(means, expected)):
        raise SystemExit(f"trained mean completion lengths {means} are not the planned "
                         f"{expected}: the length forcing did not act")


def run_peers(args: argparse.Namespace, argv: list[str]) -> dict[str, dict]:
    """Every peer ``--rounds`` times, each run in a fresh process, on one model."""
    runs: dict[str, dict] = {who: {"seconds": [], "tokens": [], "masked": [], "wait": [],
                                   "push": [], "busy": [], "plan": []} for who in args.peers}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "hf"
        make_model(model_dir, args.size, max_positions=args.max_tokens + 64)
        for _ in range(args.rounds):
            for who, run in runs.items():
                result = child_json(__file__, "RESULT", who, model_dir, argv)
                plan = result.pop("plan")
                run["busy"].append(plan["generate_seconds"] / sum(result["seconds"]))
                run["plan"].append({**plan, "steps": len(result["seconds"])})
                for key, values in result.items():
                    run[key] += values[1:]  # the first step pays one-off costs
    return runs


def report(args: argparse.Namespace, runs: dict[str, dict]) -> None:
    where = ("torch sampler in the trainer's process" if args.sampler == "torch" else
             "ray sampler: 1 Ray worker (1 CPU) running the torch sampler")
    print(f"GRPO step, long-tailed completions (<= {args.max_tokens} tokens), {args.size} "
          f"model, {args.prompts} prompts x {args.group}, packed micro-batches, "
          f"{args.threads} thread(s), CPU; partial: max_staleness {args.staleness}, "
          f"partial_tokens {args.partial_tokens}")
    plan = runs[args.peers[0]]["plan"][-1]
    print(f"  sampler: {where}; lengths forced in process {plan['pid']} "
          f"({plan['threads']} torch thread(s))")
    rate = {}
    for who, run in runs.items():
        rate[who] = sum(run["tokens"]) / sum(run["seconds"])
        finished = sum(p["at_target"] for p in run["plan"])
        aborted = sum(p["aborted"] for p in run["plan"])
        print(f"  {who:<8} {statistics.median(run['seconds']):7.3f} s/step "
              f"{rate[who]:7.0f} trained tok/s  stale-masked {statistics.mean(run['masked']):5.1%}"
              f"  sampler busy {statistics.mean(run['busy']):5.1%}  trainer waiting "
              f"{sum(run['wait']) / sum(run['seconds']):5.1%}  ({finished} completions at their "
              f"planned length, {aborted} aborted)")
    if "sync" in rate and args.sampler == "ray":
        report_ceiling(runs, rate)
    elif "sync" in rate:  # one process samples and trains in turn: nothing overlaps
        for who in rate:
            if who != "sync":
                print(f"  {who} / sync throughput: {rate[who] / rate['sync']:.2f}x")
    report_profile(runs)


def ceiling(sync: dict) -> tuple[float, float, float]:
    """(S, T, (S + T) / max(S, T)) from a synchronous run's steps: S the seconds per step
    the trainer waits for its rollout (sampling, as the trainer sees it), T the rest of
    the step (training and the weight push). Overlapping sampling with training can at
    best hide the shorter of the two."""
    sampling = sum(sync["wait"]) / len(sync["wait"])
    training = sum(sync["seconds"]) / len(sync["seconds"]) - sampling
    return sampling, training, (sampling + training) / max(sampling, training)


def report_ceiling(runs: dict[str, dict], rate: dict[str, float]) -> None:
    """Each overlapped peer's throughput over ``sync``'s, and that over the ceiling."""
    sampling, training, bound = ceiling(runs["sync"])
    print(f"  ceiling, from sync's own steps: sampling S {sampling:.3f} s + training T "
          f"{training:.3f} s per step; (S + T) / max(S, T) = {bound:.2f}x")
    for who in rate:
        if who != "sync":
            speedup = rate[who] / rate["sync"]
            print(f"  {who} / sync throughput: {speedup:.2f}x = {speedup / bound:.2f} of the "
                  "ceiling" + (" (goal >= 0.9 of the ceiling)" if who == "partial" else ""))


def report_profile(runs: dict[str, dict]) -> None:
    """Where each peer's step goes (means per step, seconds): the trainer waiting for
    rollouts, pushing weights, and the rest (its own work); the sampling process
    generating, and of that prefilling (the first step included: its counters are totals)."""
    print("  profile per step (s): trainer wait / push / own work; sampler generate "
          "(of which prefill, positions prefilled, tokens among them), generate calls")
    for who, run in runs.items():
        steps = len(run["seconds"])
        wait, push = sum(run["wait"]) / steps, sum(run["push"]) / steps
        own = sum(run["seconds"]) / steps - wait - push
        total = sum(p["steps"] for p in run["plan"])
        per = {key: sum(p[key] for p in run["plan"]) / total
               for key in ("calls", "generate_seconds", "prefill_seconds", "prefill_positions",
                           "prefill_tokens")}
        print(f"  {who:<8} {wait:6.3f} / {push:6.3f} / {own:6.3f};  {per['generate_seconds']:6.3f}"
              f" ({per['prefill_seconds']:6.3f}, {per['prefill_positions']:7.0f} positions, "
              f"{per['prefill_tokens'] / max(1, per['prefill_positions']):4.0%} tokens), "
              f"{per['calls']:.1f} generate calls")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, steps=8, prompts=4, size="tiny")
    parser.add_argument("--max-tokens", type=int, default=512, help="longest completion")
    parser.add_argument("--staleness", type=int, default=2, help="rollout.max_staleness")
    parser.add_argument("--partial-tokens", type=int, default=64, help="rollout.partial_tokens")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sampler", choices=tuple(PEERS), default="torch",
                        help="where the rollouts are sampled (default: torch, in the trainer)")
    parser.add_argument("--peers", help="comma-separated, of " + ", ".join(PEERS["ray"])
                        + " (default: all the sampler supports)")
    parser.add_argument("--only", choices=PEERS["ray"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only:
        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            result = time_astrai(Path(args.model_dir), Path(tmp), args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    args.peers = args.peers.split(",") if args.peers else list(PEERS[args.sampler])
    unknown = [who for who in args.peers if who not in PEERS[args.sampler]]
    if unknown:
        parser.error(f"--peers: {', '.join(unknown)} not available with --sampler "
                     f"{args.sampler} (choose from {', '.join(PEERS[args.sampler])})")
    report(args, run_peers(args, argv))


if __name__ == "__main__":
    main()
