"""trainer.share_prompt: a group's prompt computed once in every forward over rollout rows
(its completions attend to its keys and values) gives the log-probs, entropies, hidden
states and gradients of the unshared forward, packed or not, with environment tokens,
sliding windows and one KV head; completions never see each other; whole GRPO and PPO
runs equal the unshared ones; the option is checked."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from astrai_core.errors import ConfigError
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.online.source import groups_together
from astrai_core.rollout import policy_forward
from astrai_core.rollout.batch import RolloutBatch, pad_rows
from astrai_core.testing import build_strategy, read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.training.trainer import Trainer
from tests.training.reference import save_start_model, text_run_config, write_texts

TOL = 1e-5


def _model(**overrides) -> CausalLM:
    torch.manual_seed(5)
    config = ModelConfig(**{"vocab_size": 48, "hidden_size": 32, "intermediate_size": 64,
                            "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                            "max_position_embeddings": 128, **overrides})
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model


def _batch(prompts, completions, groups, environment=False) -> RolloutBatch:
    prompt_ids, prompt_mask = pad_rows(prompts, left=True, pad_value=0, dtype=torch.long)
    response_ids, response_mask = pad_rows(completions, left=False, pad_value=0,
                                           dtype=torch.long)
    context = None
    if environment:  # each response's second token is the environment's
        context = response_mask.clone()
        response_mask = response_mask.clone()
        response_mask[:, 1] = False
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                        response_ids=response_ids, response_mask=response_mask,
                        old_logprobs=None, rewards=torch.zeros(len(prompts)),
                        reward_components={}, group_ids=torch.tensor(groups),
                        context_mask=context)


# two groups of different prompt lengths, interleaved, completions of different lengths
# (one of a single token), and a row alone in its group
A, B, C = [3, 9, 4, 7, 1], [5, 2, 8], [6, 6, 1, 2]
PROMPTS = [A, B, A, B, A, C]
COMPLETIONS = [[11, 12, 13], [21, 22, 23, 24, 25], [14], [26, 27], [15, 16, 17, 18, 19, 20],
               [30, 31]]
GROUPS = [0, 1, 0, 1, 0, 2]


def _outputs(model, batch):
    model.zero_grad(set_to_none=True)
    out = policy_forward(model, batch, temperature=0.7, return_hidden_states=True,
                         return_entropy=True)
    mask = batch.response_mask
    # a loss touching every output, so that every gradient path is compared
    loss = (out["logprobs"][mask].mean() + out["entropy"][mask].mean()
            + out["hidden_states"][mask].square().mean())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    values = {key: torch.where(mask[..., None] if key == "hidden_states" else mask, out[key], 0)
              for key in ("logprobs", "entropy", "hidden_states")}
    return values, grads


@pytest.mark.parametrize("case", ["plain", "environment tokens", "sliding window",
                                  "one kv head", "packed"])
def test_a_shared_prompt_forward_equals_the_unshared_one(case):
    model = _model(**({"sliding_window": 4} if case == "sliding window" else {}),
                   **({"num_kv_heads": 1} if case == "one kv head" else {}))
    batch = _batch(PROMPTS, COMPLETIONS, GROUPS, environment=case == "environment tokens")
    if case == "packed":
        batch = replace(batch, packed=True)
    got, got_grads = _outputs(model, replace(batch, share_prompt=True))
    want, want_grads = _outputs(model, replace(batch, packed=False))
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=TOL, msg=key)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=TOL, msg=name)


@pytest.mark.parametrize("window", [None, 3], ids=["full", "window3"])
def test_the_varlen_kernel_call_for_shared_prompts_matches_sdpa(monkeypatch, window):
    """On CUDA, flash-attn's varlen kernel takes each completion's keys as its prompt's
    then its own: the call, against the kernel's contract in plain torch."""
    from astrai_core.model import document_attention
    from tests.model.test_document_attention import fake_varlen

    model = _model(**({"sliding_window": window} if window else {}))
    batch = replace(_batch(PROMPTS, COMPLETIONS, GROUPS), share_prompt=True)
    with torch.no_grad():
        expected = policy_forward(model, batch)["logprobs"]
        monkeypatch.setattr(document_attention, "_varlen_kernel", lambda q: fake_varlen)
        got = policy_forward(model, batch)["logprobs"]
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)


def test_each_prompt_is_computed_once():
    model = _model()
    lengths = []
    model.embed.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape))
    batch = _batch(PROMPTS, COMPLETIONS, GROUPS)
    with torch.no_grad():
        policy_forward(model, replace(batch, share_prompt=True))
    responses = sum(len(c) for c in COMPLETIONS)
    assert lengths == [torch.Size([1, len(A) + len(B) + len(C) + responses])]


def test_equally_long_completions_share_one_attention_call(monkeypatch):
    """Without a varlen kernel, a group's completions of one length attend in one batched
    call per layer (one call per completion made the backward scatter a full-length zero
    gradient per completion); their log-probs and gradients still equal the unshared
    forward's."""
    import torch.nn.functional as F

    calls: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def recording(query, key, value, **kwargs):
        calls.append(query.shape[0])
        return sdpa(query, key, value, **kwargs)

    model = _model().train()
    completions = [[11, 12, 13], [21, 22], [14, 15, 16], [26, 27], [17, 18, 19]]
    batch = _batch([A, B, A, B, A], completions, [0, 1, 0, 1, 0])
    want, want_grads = _outputs(model, batch)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    got, got_grads = _outputs(model, replace(batch, share_prompt=True))
    layers = model.config.num_layers
    # per layer: the rows owning prompts A and B (each prompt and completion), then A's
    # other two completions (3 tokens each) in one call, and B's other one
    assert sorted(calls) == sorted([1, 1, 2, 1] * layers)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=TOL, msg=key)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=TOL, msg=name)


def test_completions_of_a_group_never_see_each_other():
    """Changing one completion's tokens leaves its siblings' log-probs equal bit for bit."""
    model = _model().eval()
    batch = replace(_batch(PROMPTS, COMPLETIONS, GROUPS), share_prompt=True)
    changed = batch.response_ids.clone()
    changed[2, 0] = 40  # the first group's second completion, its only token
    changed[4, 1:4] = torch.tensor([41, 42, 43])  # and its third
    with torch.no_grad():
        before = policy_forward(model, batch)["logprobs"]
        after = policy_forward(model, replace(batch, response_ids=changed))["logprobs"]
    untouched = [0, 1, 3, 5]
    assert torch.equal(before[untouched], after[untouched])
    assert not torch.equal(before[4], after[4])  # the changed row did change


def test_a_steps_rows_are_ordered_group_by_group():
    rows = torch.tensor([5, 0, 3, 2, 4, 1])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])  # row -> group
    assert groups_together(rows, groups).tolist() == [5, 4, 0, 1, 3, 2]


# -- whole strategies ---------------------------------------------------------------------
def _config(tmp_path, strategy, **trainer):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    return tiny_run_config(tmp_path, prompts, strategy, data={"batch_size": 4},
                           sampler={"max_new_tokens": 8, "temperature": 1.5}, **trainer)


STRATEGIES = {
    "grpo": {"name": "grpo", "group_size": 4, "loss_aggregation": "seq-mean-token-mean",
             "kl_coef": 0.1, "entropy_coef": 0.01},
    "grpo 2 epochs recomputed": {"name": "grpo", "group_size": 4, "kl_coef": 0.1,
                                 "epochs": 2, "recompute_old_logprobs": True},
    "ppo": {"name": "ppo", "group_size": 4, "epochs": 2, "mini_batches": 1, "kl_coef": 0.1},
}


def _fit(tmp_path, name, strategy, **trainer):
    # Adam's first steps scale a near-zero gradient's float noise up to lr: eps=1e-6
    # keeps that noise at its own size (as in the packed and distributed equality tests)
    config = _config(tmp_path, strategy, max_steps=3, lr=2e-3, eps=1e-6, **trainer)
    config["output_dir"] = str(tmp_path / name)
    strategy, run = build_strategy(config, tmp_path)
    tokens = []  # every forward's tokens, generation's excluded (one new token per row)
    run.model.embed.register_forward_hook(
        lambda module, args, out: tokens.append(args[0].numel() if args[0].shape[1] > 1 else 0))
    Trainer(run, strategy).fit()
    metrics = [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))}
               for m in read_metrics(tmp_path / name) if "loss" in m]
    return run.model.state_dict(), metrics, sum(tokens)


# what stays the same however a step's rows are cut into micro-batches (rows go group by
# group when shared; the other metrics are means of the micro-batches' means)
STEP_METRICS = ("loss", "grad_norm", "tokens", "rollout/reward_mean",
                "rollout/advantage_mean")


@pytest.mark.parametrize("packing", [{}, {"micro_batch_tokens": 40}, {"grad_accum_steps": 2}],
                         ids=["padded", "packed", "two micro-batches"])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_shared_prompt_run_equals_the_unshared_run(tmp_path, name, packing):
    """The reference's, the old policy's and the critic's forwards shared too."""
    weights, metrics, tokens = _fit(tmp_path, "shared", STRATEGIES[name], share_prompt=True,
                                    **packing)
    ref_weights, ref_metrics, ref_tokens = _fit(tmp_path, "unshared", STRATEGIES[name],
                                                **packing)
    assert tokens < 0.8 * ref_tokens  # the prompts were computed once per group
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=TOL, msg=key)
    for got, want in zip(metrics, ref_metrics, strict=True):
        for key in STEP_METRICS:
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=TOL, abs=TOL), key


def test_the_option_is_checked(tmp_path):
    config = _config(tmp_path, {**STRATEGIES["grpo"], "router_replay": "R2"},
                     share_prompt=True)
    with pytest.raises(ConfigError, match="trainer.share_prompt.*router_replay"):
        build_strategy(config, tmp_path)
    start = save_start_model(tmp_path / "start")
    offline = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                              share_prompt=True)
    with pytest.raises(ConfigError, match="trainer.share_prompt.*online strategies"):
        build_strategy(offline, tmp_path)
