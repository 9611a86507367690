"""Evaluation by generation: greedy completions of held-out prompts, scored by the rewards."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from astrai_core.errors import ConfigError
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.records import PromptRecord, as_prompt_record
from astrai_core.sampling.params import SamplingParams

ACCURACY_REWARD = "exact_match"
# Rewards that score 1 for a right answer, 0 otherwise: the first one a run uses is its
# eval/accuracy.
ACCURACY_REWARDS = (ACCURACY_REWARD, "gsm8k", "math_verify")


def evaluate_generation(sampler: Any, tokenizer: Any, prompt_records: Sequence[Any], rewards: RewardSet,
                        max_new_tokens: int, batch_size: int = 64,
                        stop_token_ids: Sequence[int] | None = None,
                        progress: Callable[[int, int], None] | None = None, *,
                        samples: int = 1, temperature: float = 0.0, seed: int | None = None,
                        accuracy_reward: str | None = None,
                        shown: list[dict[str, Any]] | None = None, show: int = 0,
                        ) -> dict[str, float]:
    """Decode every prompt (greedy by default) and average the rewards.

    Returns ``eval/reward/<name>`` (mean of each reward), ``eval/reward`` (mean weighted
    total), ``eval/response_length`` and, when ``exact_match`` (or ``accuracy_reward``) is
    one of the rewards, ``eval/accuracy`` (its mean). Stops at ``stop_token_ids`` (default:
    the tokenizer's EOS). ``progress(done, total)`` is called after each batch with the
    prompts done so far. ``samples`` > 1 draws that many completions per prompt at
    ``temperature`` (seeded by ``seed``) and adds ``eval/pass@k`` (the unbiased estimator,
    k = 1, 2, 4, ... up to ``samples``) of the accuracy reward (1 = right). ``shown``
    receives the first ``show`` completions: the prompt exactly as the model saw it (its
    tokens decoded with the special ones), the completion, its total reward and each
    reward's score.
    """
    records = [as_prompt_record(r) for r in prompt_records]
    if not records:
        raise ValueError("evaluate_generation needs at least one prompt")
    if stop_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_token_ids = [eos] if eos is not None else []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            n=samples, stop_token_ids=tuple(stop_token_ids))
    totals: list[float] = []
    components: dict[str, list[float]] = {name: [] for name in rewards.names}
    lengths: list[int] = []
    for start in range(0, len(records), batch_size):
        prompt_chunk = records[start:start + batch_size]
        completions = sampler.generate([r.prompt_ids for r in prompt_chunk], params,
                                       **prompt_images(sampler, prompt_chunk))
        chunk = [r for r in prompt_chunk for _ in range(samples)]  # one per completion
        texts = [c.text if c.text is not None else tokenizer.decode(c.token_ids, skip_special_tokens=True)
                 for c in completions]
        prompts = [r.prompt_text or tokenizer.decode(r.prompt_ids, skip_special_tokens=False) for r in chunk]
        chunk_totals, chunk_components = rewards.score(prompts, texts, [r.columns for r in chunk],
                                                       completion_ids=[c.token_ids for c in completions])
        if shown is not None and len(shown) < show:
            shown += samples_shown(tokenizer, chunk, texts, chunk_totals,
                                   chunk_components)[:show - len(shown)]
        totals += chunk_totals
        for name, values in chunk_components.items():
            components[name] += values
        lengths += [len(c.token_ids) for c in completions]
        if progress is not None:
            progress(len(lengths) // samples, len(records))
    metrics = _summary(totals, components, lengths, accuracy_reward)
    accuracy = components.get(accuracy_reward or _accuracy_name(components) or "")
    if samples > 1 and accuracy is not None:
        metrics.update(pass_at_k(accuracy, samples))
    return metrics


def prompt_images(sampler: Any, records: Sequence[PromptRecord]) -> dict[str, Any]:
    """``{"images": [...]}`` for a sampler's generate when any prompt has images (a
    vision-language model's; None for the others), else nothing; a ConfigError when the
    sampler's generate takes no images."""
    images = [r.images for r in records]
    if not any(i is not None for i in images):
        return {}
    if "images" not in inspect.signature(sampler.generate).parameters:
        raise ConfigError(f"the prompts have images, and the {type(sampler).__name__} sampler "
                          "takes none; use the torch sampler")
    return {"images": images}


def samples_shown(tokenizer: Any, records: Sequence[Any], texts: Sequence[str],
                  totals: Sequence[float], components: dict[str, list[float]],
                  ) -> list[dict[str, Any]]:
    """One dict per completion: the prompt exactly as the model saw it (its tokens decoded
    with the special ones), the completion, its total reward and each reward's score."""
    return [{"prompt": tokenizer.decode(list(r.prompt_ids), skip_special_tokens=False),
             "completion": text, "reward": float(total),
             "rewards": {name: float(values[i]) for name, values in components.items()}}
            for i, (r, text, total) in enumerate(zip(records, texts, totals))]


def pass_at_k(scores: Sequence[float], samples: int) -> dict[str, float]:
    """``eval/pass@k`` for k = 1, 2, 4, ... and ``samples``: the mean over prompts of the
    unbiased estimator 1 - C(n-c, k) / C(n, k) (n samples of a prompt, c of them right,
    i.e. scoring 1), ``scores`` holding each prompt's ``samples`` scores in a row."""
    from math import comb

    correct = [sum(1 for s in scores[i:i + samples] if s >= 1.0)
               for i in range(0, len(scores), samples)]
    ks = sorted({*(2 ** e for e in range(samples.bit_length()) if 2 ** e <= samples), samples})
    return {f"eval/pass@{k}": _mean([1.0 - comb(samples - c, k) / comb(samples, k)
                                     for c in correct]) for k in ks}


def evaluate_episodes(episodes: Any, prompt_records: Sequence[Any], max_new_tokens: int,
                      batch_size: int = 64,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """:func:`evaluate_generation` for multi-turn episodes: greedy turns with the episode
    runner's environment, ``max_new_tokens`` per turn. Adds ``eval/turns_mean``,
    ``eval/tool_calls_mean``, ``eval/tool_error_rate`` and ``eval/env_seconds``."""
    from astrai_core.rollout.metrics import episode_metrics

    records = [as_prompt_record(r) for r in prompt_records]
    if not records:
        raise ValueError("evaluate_episodes needs at least one prompt")
    eos = getattr(episodes.tokenizer, "eos_token_id", None)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0,
                            stop_token_ids=(eos,) if eos is not None else ())
    totals: list[float] = []
    components: dict[str, list[float]] = {}
    lengths: list[int] = []
    stats: list[dict[str, float]] = []
    finishes: list[str] = []
    for start in range(0, len(records), batch_size):
        batch = episodes.run(records[start:start + batch_size], params)
        totals += batch.rewards.tolist()
        for name, values in batch.reward_components.items():
            components.setdefault(name, []).extend(values.tolist())
        lengths += batch.response_lengths().tolist()
        stats += batch.episode_stats
        finishes += batch.finish_reasons
        if progress is not None:
            progress(len(lengths), len(records))
    return {**_summary(totals, components, lengths),
            **episode_metrics(stats, finishes, prefix="eval/")}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _summary(totals: Sequence[float], components: dict[str, list[float]],
             lengths: Sequence[int], accuracy_reward: str | None = None) -> dict[str, float]:
    metrics = {f"eval/reward/{name}": _mean(values) for name, values in components.items()}
    metrics["eval/reward"] = _mean(totals)
    metrics["eval/response_length"] = _mean(lengths)
    accuracy = accuracy_reward or _accuracy_name(components)
    if accuracy in components:
        metrics["eval/accuracy"] = metrics[f"eval/reward/{accuracy}"]
    return metrics


def _accuracy_name(components: dict[str, list[float]]) -> str | None:
    return next((name for name in ACCURACY_REWARDS if name in components), None)
