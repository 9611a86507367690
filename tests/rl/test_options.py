"""The loss options strategies share: one owner per field, every strategy's defaults kept."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from astrai_core.plugins import load_plugins
from astrai_core.rl.objective import ObjectiveSettings
from astrai_core.rl.options import (AggregationOption, AuxLossOption, EntropyOption,
                                    KLEstimatorOption, KLPenaltyOption, LossAggregationOptions)

OWNERS = {"aux_loss_coef": AuxLossOption, "entropy_coef": EntropyOption,
          "kl_coef": KLPenaltyOption, "kl_estimator": KLEstimatorOption,
          "loss_aggregation": AggregationOption, "norm_length": LossAggregationOptions}

# The defaults each strategy had before the fields moved to their owners.
DEFAULTS = {
    "grpo": {"kl_estimator": "k3", "kl_coef": 0.0, "entropy_coef": 0.0,
             "loss_aggregation": "token-mean", "norm_length": None, "aux_loss_coef": None},
    "ppo": {"kl_estimator": "k1", "kl_coef": 0.0, "entropy_coef": 0.0,
            "loss_aggregation": "token-mean", "aux_loss_coef": None},
    "reinforce": {"kl_estimator": "k1", "entropy_coef": 0.0},
    "distill": {"loss_aggregation": "token-mean", "norm_length": None, "aux_loss_coef": None},
    "dpo": {"aux_loss_coef": None}, "orpo": {"aux_loss_coef": None},
    "kto": {"aux_loss_coef": None}, "rm": {"aux_loss_coef": None},
    "sft": {"aux_loss_coef": None}, "seq": {"aux_loss_coef": None},
}


def _configs():
    registry = load_plugins()
    return {name: registry.get("strategy", name).load().Config
            for name in registry.names("strategy")}


def test_every_strategy_takes_a_shared_field_from_its_owner():
    checked = 0
    for name, config in _configs().items():
        for field, owner in OWNERS.items():
            if field not in config.model_fields:
                continue
            ours, theirs = config.model_fields[field], owner.model_fields[field]
            assert ours.description == theirs.description, (name, field)
            assert ours.metadata == theirs.metadata, (name, field)  # the same bounds
            checked += 1
    assert checked >= 20  # grpo, ppo, distill, the preference family, rm, sft... all seen


def test_each_strategy_keeps_its_defaults():
    configs = _configs()
    for name, expected in DEFAULTS.items():
        config = configs[name]
        shared = {field for field in OWNERS if field in config.model_fields}
        assert shared == set(expected), name  # no strategy gained or lost an option
        values = config.model_validate({"teacher": "t"} if name == "distill" else {})
        assert {field: getattr(values, field) for field in expected} == expected, name


def test_the_objective_settings_of_a_config():
    grpo = _configs()["grpo"].model_validate(
        {"loss_aggregation": "seq-mean-token-sum-norm", "norm_length": 7, "kl_coef": 0.1,
         "entropy_coef": 0.01})
    assert ObjectiveSettings.of(grpo) == ObjectiveSettings(
        loss_aggregation="seq-mean-token-sum-norm", norm_length=7, kl_coef=0.1,
        kl_estimator="k3", entropy_coef=0.01)
    ppo = _configs()["ppo"].model_validate({"kl_estimator": "k2"})
    assert ObjectiveSettings.of(ppo) == ObjectiveSettings(kl_estimator="k2")


@pytest.mark.parametrize("name,options,message", [
    ("grpo", {"norm_length": 4}, "norm_length applies only to loss_aggregation"),
    ("distill", {"teacher": "t", "norm_length": 4}, "norm_length applies only"),
    ("ppo", {"loss_aggregation": "seq-mean-token-sum"}, "loss_aggregation"),
    ("ppo", {"norm_length": 4}, "norm_length"),  # ppo has no such option
    ("reinforce", {"kl_estimator": "k4"}, "kl_estimator"),
    ("dpo", {"aux_loss_coef": -1}, "aux_loss_coef"),
])
def test_the_owners_checks_apply(name, options, message):
    with pytest.raises(ValidationError, match=message):
        _configs()[name].model_validate(options)
