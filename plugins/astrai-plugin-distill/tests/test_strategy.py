"""The distill strategy: registry and CLI, config checks, the data paths of
on_policy_fraction, training from YAML, a LoRA student."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from astrai_core.config.loader import load_config
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.testing import (ARITH_TOKENIZER, build_strategy, read_metrics, run_astrai)
from astrai_core.training.run import train
from astrai_plugin_distill.onpolicy import on_policy_rows, reply_start


def test_strategy_loads_by_name_and_cli_shows_it():
    from astrai_plugin_distill.strategy import Distill

    assert load_plugins().get("strategy", "distill").load() is Distill
    listed = run_astrai("list-plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    entry = next(p for p in json.loads(listed.stdout) if p["name"] == "distill")
    assert entry["status"] == "ok" and entry["provides"]["strategy"] == ["distill"]
    described = run_astrai("describe", "strategy", "distill")
    assert described.returncode == 0, described.stderr
    for key in ("teacher", "loss", "beta", "top_k", "temperature", "on_policy_fraction"):
        assert key in described.stdout


def test_unknown_name_suggests_the_pip_install():
    from astrai_core.plugins.registry import Registry

    message = Registry().unknown_message("strategy", "distill")
    assert "pip install astrai-plugin-distill" in message


def _plan_error(tmp_path, config):
    with pytest.raises(ConfigError) as error:
        build_strategy(config, tmp_path)
    return str(error.value)


def test_teacher_with_another_vocabulary_is_refused(tmp_path, chats, teacher_factory,
                                                  distill_config):
    other = teacher_factory(tmp_path / "big_vocab", vocab_size=60)
    message = _plan_error(tmp_path, distill_config(tmp_path, chats, other,
                                                          on_policy_fraction=0.0))
    assert "strategy.teacher" in message and "shared tokenizer" in message
    assert str(tmp_path / "big_vocab") in message and "60" in message


def test_teacher_with_other_tokenizer_files_is_refused(tmp_path, chats, teacher_factory,
                                                      distill_config):
    import shutil

    tokenizer = tmp_path / "tok"
    shutil.copytree(ARITH_TOKENIZER, tokenizer)
    data = json.loads((tokenizer / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]  # swap two ids: same size
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (tokenizer / "tokenizer.json").write_text(json.dumps(data))
    other = teacher_factory(tmp_path / "other_tok", tokenizer_dir=tokenizer)
    message = _plan_error(tmp_path, distill_config(tmp_path, chats, other,
                                                          on_policy_fraction=0.0))
    assert "tokenizer" in message and str(tmp_path / "other_tok") in message
    assert str(ARITH_TOKENIZER) in message


def test_config_mistakes_name_their_field(tmp_path, chats, teacher, distill_config,
                                         monkeypatch):
    def error(teacher, **strategy):
        return _plan_error(tmp_path, distill_config(tmp_path, chats, teacher, **strategy))

    assert "strategy.teacher" in error(tmp_path / "nowhere")
    config = distill_config(tmp_path, chats, teacher, on_policy_fraction=0.5)
    config["data"]["pack"] = True
    with pytest.raises(ConfigError, match="data.pack"):
        build_strategy(config, tmp_path)
    assert "top_k" in error(teacher, loss="jsd", top_k=3)
    assert "beta" in error(teacher, loss="reverse_kl", beta=0.2)
    assert "on_policy_fraction" in error(teacher, loss="reverse_kl", estimator="sampled",
                                         on_policy_fraction=0.5)
    config = distill_config(tmp_path, chats, teacher, on_policy_fraction=0.5)
    config["parallel"] = {"context_parallel": 2}
    build_strategy(config, tmp_path)  # one process: the parallel section does not apply
    monkeypatch.setenv("WORLD_SIZE", "2")
    message = _plan_error(tmp_path, config)
    assert message.startswith("parallel.context_parallel:") and "on_policy_fraction: 0" in message


def test_on_policy_rows_spread_evenly_and_split_over_ranks():
    assert on_policy_rows(0, 8, 0.0) == []
    assert on_policy_rows(0, 8, 1.0) == list(range(8))
    assert on_policy_rows(0, 8, 0.5) == [1, 3, 5, 7]
    assert len(on_policy_rows(0, 16, 0.25)) == 4
    # two ranks of 4 rows pick the rows the one-process run picks
    assert on_policy_rows(0, 4, 0.3) + [4 + i for i in on_policy_rows(4, 4, 0.3)] == \
        on_policy_rows(0, 8, 0.3)
    assert reply_start(torch.tensor([0, 1, 1, 0, 0, 1, 1, 1])) == 5
    assert reply_start(torch.tensor([0, 0])) is None


def test_fraction_zero_reads_dataset_replies_and_builds_no_sampler(tmp_path, chats, teacher, distill_config):
    from astrai_core.api import LoaderSource

    distill, run = build_strategy(distill_config(tmp_path, chats, teacher,
                                                 on_policy_fraction=0.0), tmp_path)
    assert run.sampler is None  # nothing samples: no sampler at all
    source = distill.batch_source()
    assert isinstance(source, LoaderSource)
    batch = source.next_step()[0]
    # the rows are the dataset's conversations: each reply is the sum, then <|end|>
    rows = [json.loads(line) for line in chats.read_text().splitlines()][:8]
    replies = [run.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
               for ids, mask in zip(batch["input_ids"], batch["loss_mask"])]
    assert replies == [r["messages"][1]["content"] for r in rows]


class _Recorder:
    """The run's sampler, recording each call."""

    def __init__(self, sampler):
        self.sampler, self.calls = sampler, []
        self.model = sampler.model

    def generate(self, prompts, params):
        outs = self.sampler.generate(prompts, params)
        self.calls.append((prompts, params, outs))
        return outs


@pytest.mark.parametrize("fraction,sampled", [(1.0, list(range(8))), (0.5, [1, 3, 5, 7])])
def test_on_policy_rows_carry_the_students_samples(tmp_path, chats, teacher, fraction, sampled, distill_config):
    distill, run = build_strategy(distill_config(tmp_path, chats, teacher,
                                                 on_policy_fraction=fraction), tmp_path)
    source = distill.batch_source()
    rows = [json.loads(line) for line in chats.read_text().splitlines()]
    recorder = _Recorder(run.sampler)
    source.sampler = recorder
    batch = source.next_step()[0]
    assert batch["on_policy"].nonzero().flatten().tolist() == sampled
    (prompts, params, outs), = recorder.calls
    assert len(prompts) == len(sampled) and [p.seed for p in params] == sampled
    for k, row in enumerate(sampled):
        out = next(o for o in outs if o.prompt_index == k)
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :length].tolist()
        assert ids == prompts[k] + list(out.token_ids)          # prompt, then the sample
        targets = batch["loss_mask"][row, :length].tolist()
        assert targets == [False] * len(prompts[k]) + [True] * len(out.token_ids)
        # the prompt is the conversation up to the reply, as generation renders it
        question = rows[row]["messages"][0]["content"]
        assert run.tokenizer.decode(prompts[k]) == f"<|user|>{question}<|end|><|assistant|>"
    kept = [r for r in range(8) if r not in sampled]
    for row in kept:  # dataset rows: a reply that ends with <|end|>
        length = int(batch["attention_mask"][row].sum())
        assert batch["input_ids"][row, length - 1].item() == 5
    assert source.stats["distill/on_policy_rows"] == len(sampled)
    loss, metrics = distill.compute_loss(batch)
    assert math.isfinite(loss.item()) and metrics["tokens"].item() > 0


def test_the_sampler_gets_the_students_weights_after_every_step(tmp_path, chats, teacher,
                                                                 distill_config, monkeypatch):
    """One that shares the policy (the torch sampler, vLLM's engine) is told it changed in
    place; one that does not gets the student's state dict."""
    import dataclasses

    from astrai_core.api import SamplerCapabilities

    distill, run = build_strategy(distill_config(tmp_path, chats, teacher,
                                                 on_policy_fraction=0.5), tmp_path)
    pushes = []
    monkeypatch.setattr(run.sampler, "update_weights", lambda state_dict=None:
                        pushes.append(state_dict))
    assert run.sampler_capabilities.shares_policy
    distill.after_optimizer_step(1)
    assert pushes == [None]
    distill.run = dataclasses.replace(run, sampler_capabilities=SamplerCapabilities())
    distill.after_optimizer_step(2)
    expected = run.model.state_dict()
    assert pushes[1].keys() == expected.keys()
    assert all(torch.equal(pushes[1][name], expected[name]) for name in expected)


def test_sft_coef_adds_the_cross_entropy_on_dataset_replies_only(tmp_path, chats, teacher,
                                                                 distill_config):
    import torch.nn.functional as F

    coef = 0.7
    plain, run = build_strategy(distill_config(tmp_path, chats, teacher, loss="forward_kl",
                                               on_policy_fraction=0.5), tmp_path)
    mixed, mixed_run = build_strategy(distill_config(tmp_path, chats, teacher,
                                                     loss="forward_kl", on_policy_fraction=0.5,
                                                     sft_coef=coef), tmp_path / "b")
    for a, b in zip(run.model.parameters(), mixed_run.model.parameters()):
        assert torch.equal(a, b)  # the same student: the losses differ by the NLL term only
    batch = plain.batch_source().next_step()[0]
    assert batch["on_policy"].tolist() == [False, True] * 4
    divergence, _ = plain.compute_loss(batch)
    loss, metrics = mixed.compute_loss(batch)
    # the reference NLL: the student's full logits, dataset rows' reply tokens, over all
    # reply tokens (token-mean)
    with torch.no_grad():
        logits = run.model(batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"])["logits"][:, :-1].float()
    mask = batch["loss_mask"][:, 1:].bool()
    nll = F.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    dataset = mask & ~batch["on_policy"][:, None]
    expected = divergence.item() + coef * (nll * dataset).sum().item() / mask.sum().item()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["sft_nll"].item() == pytest.approx(nll[dataset].mean().item(), rel=1e-5)
    with pytest.raises(ConfigError, match="sft_coef"):
        build_strategy(distill_config(tmp_path, chats, teacher, on_policy_fraction=1.0,
                                      sft_coef=1.0), tmp_path / "c")


TEACHER_ROWS = (0, 2, 5)


def test_teacher_correct_only_drops_the_divergence_where_the_teacher_is_wrong(
        tmp_path, chats, teacher, distill_config):
    import torch.nn.functional as F

    from astrai_plugin_distill.losses import forward_kl

    coef = 0.5
    strategy, run = build_strategy(distill_config(
        tmp_path, chats, teacher, loss="forward_kl", on_policy_fraction=0.0, sft_coef=coef,
        teacher_correct_only=True), tmp_path)
    batch = strategy.batch_source().next_step()[0]
    forward = {"attention_mask": batch["attention_mask"], "position_ids": batch["position_ids"]}
    with torch.no_grad():  # rows whose replies the teacher writes greedily, token by token
        for position in batch["loss_mask"][list(TEACHER_ROWS)].any(0).nonzero().flatten():
            greedy = strategy.teacher(batch["input_ids"], **forward)["logits"].argmax(-1)
            for row in TEACHER_ROWS:
                if batch["loss_mask"][row, position]:
                    batch["input_ids"][row, position] = greedy[row, position - 1]
    loss, metrics = strategy.compute_loss(batch)
    with torch.no_grad():
        s_logits = run.model(batch["input_ids"], **forward)["logits"][:, :-1].float()
        t_logits = strategy.teacher(batch["input_ids"], **forward)["logits"][:, :-1].float()
    mask, targets = batch["loss_mask"][:, 1:].bool(), batch["input_ids"][:, 1:]
    right = ((t_logits.argmax(-1) == targets) | ~mask).all(-1)  # the teacher's greedy reply
    divergence = forward_kl(s_logits, t_logits).masked_fill(~right[:, None], 0.0)
    nll = F.cross_entropy(s_logits.transpose(1, 2), targets, reduction="none")
    expected = ((divergence + coef * nll) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["distill/teacher_correct_rows"].item() == right.sum().item()
    assert right.tolist() == [row in TEACHER_ROWS for row in range(len(right))]
    with pytest.raises(ConfigError, match="teacher_correct_only"):
        build_strategy(distill_config(tmp_path, chats, teacher, teacher_correct_only=True),
                       tmp_path / "b")


def _write_yaml(tmp_path, config):
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("strategy", [
    {"loss": "forward_kl", "on_policy_fraction": 0.0},
    {"loss": "reverse_kl", "on_policy_fraction": 1.0},
    {"loss": "jsd", "beta": 0.5, "on_policy_fraction": 0.5},
])
def test_trains_from_yaml_and_the_loss_falls(tmp_path, chats, teacher, strategy, distill_config):
    config = distill_config(tmp_path, chats, teacher, **strategy)
    config["trainer"].update(max_steps=30, lr=1e-2)
    path = _write_yaml(tmp_path, config)
    train(load_config(path))
    losses = [r["distill_loss"] for r in read_metrics(tmp_path / "run")]
    assert len(losses) == 30
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


def test_lora_student_trains_only_its_adapter(tmp_path, chats, teacher, distill_config):
    config = distill_config(tmp_path, chats, teacher, loss="forward_kl", on_policy_fraction=0.5)
    config["model"]["lora"] = {"r": 4, "alpha": 8}
    config["trainer"].update(max_steps=6, lr=1e-2, save_every=6)
    distill, run = build_strategy(config, tmp_path)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    from astrai_core.training.trainer import Trainer

    Trainer(run, distill).fit()
    changed = {n for n, p in run.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    losses = [r["distill_loss"] for r in read_metrics(tmp_path / "run")]
    assert losses[-1] < losses[0]
    assert (tmp_path / "run" / "checkpoints" / "step_6" / "adapter").is_dir()


def test_resume_continues_the_samples_and_data_exactly(tmp_path, chats, teacher,
                                                       distill_config):
    """A run resumed from its step-2 checkpoint samples and trains like the uninterrupted
    run: the loader position and the draw count (which seeds the samples) are restored."""
    import shutil

    config = distill_config(tmp_path, chats, teacher, loss="jsd", on_policy_fraction=0.5)
    config["trainer"].update(max_steps=4, save_every=2)
    path = _write_yaml(tmp_path, config)
    train(load_config(path))
    whole = read_metrics(tmp_path / "run")
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run" / "checkpoints" / "step_2",
                    resumed / "checkpoints" / "step_2")
    config["output_dir"] = str(resumed)
    train(load_config(_write_yaml(tmp_path, config)), resume=True)
    again = read_metrics(resumed)
    assert [r["step"] for r in again] == [3, 4]
    for mine, ref in zip(again, whole[2:]):
        assert mine["distill_loss"] == pytest.approx(ref["distill_loss"], rel=1e-6)
        assert mine["tokens"] == ref["tokens"]


def _default_config(tmp_path, chats, teacher):
    """A distill run as a user first writes it: the teacher, nothing about packing."""
    from astrai_core.testing import tiny_run_config

    config = tiny_run_config(tmp_path, chats, {"name": "distill", "teacher": str(teacher)},
                             data_format="chat", data={"shuffle": False}, rewards=[],
                             max_steps=1)
    assert "pack" not in config["data"]  # on_policy_fraction 0.5 by default, so it samples
    return config


def test_a_default_config_trains_on_unpacked_rows(tmp_path, chats, teacher, distill_config):
    from astrai_core.config.plan import plan_run
    from astrai_core.config.schema import RunConfig

    config = _default_config(tmp_path, chats, teacher)
    plan = plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
    assert plan.config.data.pack is False and plan.needs.generates
    train(load_config(_write_yaml(tmp_path, config)))
    default = read_metrics(tmp_path / "run")
    # the same step as the run that says data.pack: false itself
    config["data"]["pack"] = False
    config["output_dir"] = str(tmp_path / "unpacked")
    train(load_config(_write_yaml(tmp_path, config)))
    unpacked = read_metrics(tmp_path / "unpacked")
    assert len(default) == 1 and default[0]["distill/on_policy_rows"] > 0
    assert default[0]["distill_loss"] == unpacked[0]["distill_loss"]


def test_data_pack_true_with_sampling_is_one_error_line(tmp_path, chats, teacher):
    config = _default_config(tmp_path, chats, teacher)
    config["data"]["pack"] = True
    result = run_astrai("train", str(_write_yaml(tmp_path, config)))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "data.pack" in errors[0] and "on_policy_fraction" in errors[0], errors[0]
    assert not (tmp_path / "run").exists()  # nothing written
