"""Weighted reward functions applied together, with errors that name the failing reward.

How a config entry becomes a reward (``rewards: [{name: ..., weight: ..., **options}]``):

- ``name`` is a registered ``reward_function`` (``exact_match``) or a user function
  written ``"module.path:function"`` (imported directly, no plugin needed).
- A target that is a **class** is built with the entry's options as keyword arguments
  (validated by its nested pydantic ``Config`` when it has one); the instance is the reward.
- A target that is a **function** is the reward itself and takes no options.

Every reward is called as ``f(prompts, completions, completion_ids=..., **columns)``
(TRL's convention; columns are the prompt dataset's other fields, one list per column)
and must return one finite number per completion.
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astrai_core.errors import AstraiError

RewardFn = Callable[..., Sequence[float]]


class RewardError(AstraiError):
    """A reward function raised or returned something unusable; the message names it."""


@dataclass(frozen=True)
class RewardTerm:
    """One reward function with its weight; ``name`` labels its component metric."""

    name: str
    fn: RewardFn
    weight: float = 1.0


def build_reward(name: str, params: Mapping[str, Any] | None = None,
                 registry: Any = None) -> RewardFn:
    """A callable reward from a config entry's name and options (see the module docstring)."""
    return _resolver(registry).reward(name, 1.0, dict(params or {}), ("rewards", name)).fn


def _resolver(registry: Any) -> Any:
    from astrai_core.config.plan import Resolver
    from astrai_core.plugins import process_registry

    return Resolver(registry if registry is not None else process_registry())


class RewardSet:
    """Weighted reward terms: ``scores = sum_i weight_i * reward_i``."""

    def __init__(self, terms: Sequence[RewardTerm]) -> None:
        self.terms = _unique_names(list(terms))

    @classmethod
    def from_config(cls, entries: Sequence[Mapping[str, Any]], registry: Any = None) -> RewardSet:
        """From config entries (dicts with name, weight and options), resolved like a run's."""
        resolver = _resolver(registry)
        choices = []
        for index, entry in enumerate(entries):
            data = dict(entry)
            name, weight = data.pop("name"), float(data.pop("weight", 1.0))
            choices.append(resolver.reward(name, weight, data, ("rewards", index)))
        return cls.from_choices(choices)

    @classmethod
    def from_choices(cls, choices: Sequence[Any]) -> RewardSet:
        """From a run plan's resolved rewards."""
        return cls([RewardTerm(name=c.label, fn=c.fn, weight=c.weight) for c in choices])

    @property
    def names(self) -> list[str]:
        return [term.name for term in self.terms]

    def score(self, prompts: Sequence[str], completions: Sequence[str],
              columns: Sequence[Mapping[str, Any]], completion_ids: Sequence[Sequence[int]] | None = None
              ) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted total per completion, {reward name: its raw values})."""
        count = len(completions)
        if len(prompts) != count or len(columns) != count:
            raise ValueError(f"{len(prompts)} prompts, {count} completions and {len(columns)} column rows")
        kwargs = columns_by_name(columns)
        kwargs["completion_ids"] = [list(ids) for ids in completion_ids] if completion_ids is not None else None
        components = {term.name: self._call(term, list(prompts), list(completions), kwargs, count)
                      for term in self.terms}
        totals = [math.fsum(term.weight * components[term.name][i] for term in self.terms)
                  for i in range(count)]
        return totals, components

    @staticmethod
    def _call(term: RewardTerm, prompts: list[str], completions: list[str],
              kwargs: dict[str, Any], count: int) -> list[float]:
        try:
            values = term.fn(prompts, completions, **kwargs)
        except Exception as err:
            frame = traceback.extract_tb(err.__traceback__)[-1]
            raise RewardError(f"reward {term.name!r} raised {type(err).__name__}: {err} "
                              f"(at {frame.filename}:{frame.lineno})") from err
        return _check_values(term.name, values, count)


def columns_by_name(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows of columns -> one list per column (None where a row lacks it)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return {name: [row.get(name) for row in rows] for name in names}


def _check_values(name: str, values: Any, count: int) -> list[float]:
    if hasattr(values, "tolist"):  # a tensor or an array
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise RewardError(f"reward {name!r} returned {type(values).__name__}, expected a list of "
                          f"{count} numbers")
    if len(values) != count:
        raise RewardError(f"reward {name!r} returned {len(values)} values for {count} completions")
    checked = []
    for index, value in enumerate(values):
        if not isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
            raise RewardError(f"reward {name!r} returned {value!r} for completion {index}, "
                              "expected a number")
        number = float(value)
        if not math.isfinite(number):
            raise RewardError(f"reward {name!r} returned a non-finite value ({number}) for "
                              f"completion {index}")
        checked.append(number)
    return checked


def _unique_names(terms: list[RewardTerm]) -> list[RewardTerm]:
    """Rename repeated names (``format_regex``, ``format_regex_2``) so components stay apart."""
    seen: dict[str, int] = {}
    unique = []
    for term in terms:
        seen[term.name] = seen.get(term.name, 0) + 1
        label = term.name if seen[term.name] == 1 else f"{term.name}_{seen[term.name]}"
        unique.append(term if label == term.name else RewardTerm(label, term.fn, term.weight))
    return unique
