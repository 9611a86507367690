"""The ppo loss on a fixed batch equals a direct evaluation of its formulas; padding is inert."""

from __future__ import annotations

import pytest
import torch

TEMPERATURE = 0.8
STRATEGY = {"eps_low": 0.1, "eps_high": 0.15, "vf_coef": 0.5, "value_clip_eps": 0.05,
            "entropy_coef": 0.01, "kl_coef": 0.1, "kl_estimator": "k3"}


def _setup(ppo, tmp_path, **strategy):
    config = ppo.run_config(tmp_path, {**STRATEGY, **strategy})
    config["sampler"]["temperature"] = TEMPERATURE
    ppo_strategy, context = ppo.make_strategy(tmp_path, config)
    with torch.no_grad():  # a non-zero head, so values depend on the backbone
        ppo_strategy.critic.value_head.weight.normal_(0.0, 0.5)
        ppo_strategy.critic.value_head.bias.fill_(0.1)
    return ppo_strategy, context


def _direct(ppo, policy, critic, batch):
    """Per-token log-probs, entropies and values from unpadded forwards of each row."""
    shape = batch.response_ids.shape
    logp, entropy, values = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
    for row in range(len(batch)):
        tokens, p, r = ppo.real_tokens(batch, row)
        scaled = policy(tokens)["logits"][0] / TEMPERATURE
        hidden = critic.backbone(tokens, return_hidden_states=True)["hidden_states"][0]
        for t in range(r):
            log_probs = torch.log_softmax(scaled[p + t - 1], dim=-1)
            logp[row, t] = log_probs[tokens[0, p + t]]
            entropy[row, t] = -(log_probs.exp() * log_probs).sum()
            values[row, t] = critic.value_head(hidden[p + t - 1]).squeeze()
    return logp, entropy, values


def _attach(batch, logp, values, generator):
    """Behaviour log-probs, advantages, old values, returns and reference log-probs chosen so
    that some ratios and some values fall outside their clip ranges."""
    noise = lambda scale: scale * torch.randn(logp.shape, generator=generator)  # noqa: E731
    batch.old_logprobs = (logp + noise(0.3)).detach()
    batch.advantages, batch.values = noise(1.0), (values + noise(0.1)).detach()
    batch.returns, batch.ref_logprobs = noise(1.0), (logp + noise(0.2)).detach()
    return batch


def _aggregate(per_token, mask, mode):
    if mode == "token-mean":
        return per_token[mask].sum() / mask.sum()
    return torch.stack([per_token[i][mask[i]].mean() for i in range(len(mask))]).mean()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_loss_equals_direct_formula(ppo, tmp_path, mode):
    strategy, context = _setup(ppo, tmp_path, loss_aggregation=mode)
    batch = ppo.fixed_rollout(context.model.config.vocab_size)
    with torch.no_grad():
        logp, entropy, values = _direct(ppo, context.model, strategy.critic, batch)
    batch = _attach(batch, logp, values, torch.Generator().manual_seed(1))
    loss, metrics = strategy.compute_loss(batch)

    mask, cfg = batch.response_mask, strategy.config
    advantages, old_values, returns = batch.advantages, batch.values, batch.returns
    ratio = torch.exp(logp - batch.old_logprobs)
    policy_per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(
        1 - cfg.eps_low, 1 + cfg.eps_high))
    clipped_values = old_values + (values - old_values).clamp(-cfg.value_clip_eps,
                                                              cfg.value_clip_eps)
    value_per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
    log_ratio = logp - batch.ref_logprobs
    kl_per_token = torch.exp(-log_ratio) + log_ratio - 1
    expected = (_aggregate(policy_per_token, mask, mode)
                + cfg.vf_coef * value_per_token[mask].mean()
                - cfg.entropy_coef * _aggregate(entropy, mask, mode)
                + cfg.kl_coef * _aggregate(kl_per_token, mask, mode))
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)

    # The batch exercises both clip ranges, so the formula's max() really chose.
    assert 0 < metrics["clip_fraction"] < 1
    outside = ((values - old_values).abs() > cfg.value_clip_eps)[mask].float().mean()
    assert 0 < outside < 1
    torch.testing.assert_close(metrics["value_clip_ratio"], outside)
    torch.testing.assert_close(metrics["value_mean"], values[mask].mean(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(metrics["return_mean"], returns[mask].mean())
    residual = (returns - values)[mask]
    torch.testing.assert_close(metrics["explained_variance"],
                               1 - residual.var(unbiased=False) / returns[mask].var(unbiased=False),
                               atol=1e-5, rtol=1e-5)
    assert metrics["tokens"] == mask.sum()


def _loss_and_grads(strategy, context, batch):
    values_seen = []

    def keep_values(module, args, output):
        output.retain_grad()
        values_seen.append(output)

    hook = strategy.critic.value_head.register_forward_hook(keep_values)
    try:
        loss, _ = strategy.compute_loss(batch)
    finally:
        hook.remove()
    context.model.zero_grad(set_to_none=True)
    strategy.critic.zero_grad(set_to_none=True)
    loss.backward()
    params = list(context.model.named_parameters()) + list(strategy.critic.named_parameters())
    grads = {name: p.grad.clone() for name, p in params if p.grad is not None}
    return loss.detach(), grads, values_seen[0].grad.squeeze(-1)


def test_padding_contributes_nothing_to_loss_or_gradients(ppo, tmp_path):
    strategy, context = _setup(ppo, tmp_path)
    batch = ppo.fixed_rollout(context.model.config.vocab_size)
    with torch.no_grad():
        logp, _, values = _direct(ppo, context.model, strategy.critic, batch)
    batch = _attach(batch, logp, values, torch.Generator().manual_seed(2))
    loss, grads, value_grad = _loss_and_grads(strategy, context, batch)
    mask = batch.response_mask
    assert torch.all(value_grad[~mask] == 0) and torch.count_nonzero(value_grad[mask]) > 0

    # Large garbage at every padded position: ids, behaviour log-probs and all extras.
    garbage = batch.select(range(len(batch)))
    garbage.prompt_ids = torch.where(batch.prompt_mask, batch.prompt_ids, 7)
    garbage.response_ids = torch.where(mask, batch.response_ids, 9)
    garbage.old_logprobs = torch.where(mask, batch.old_logprobs, -1e3)
    for name in ("advantages", "values", "returns", "ref_logprobs"):
        setattr(garbage, name, torch.where(mask, getattr(batch, name), 1e3))
    loss_again, grads_again, _ = _loss_and_grads(strategy, context, garbage)
    torch.testing.assert_close(loss_again, loss, atol=1e-6, rtol=1e-6)
    assert grads.keys() == grads_again.keys()
    for name in grads:
        torch.testing.assert_close(grads_again[name], grads[name], atol=1e-6, rtol=1e-5)


def test_moe_load_balancing_loss_of_policy_and_critic_is_added(ppo, tmp_path):
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    losses = {}
    for coef in (0.0, 0.5):
        run_dir = tmp_path / f"coef_{coef}"
        run_dir.mkdir()
        config = ppo.run_config(run_dir, {"aux_loss_coef": coef})
        config["model"]["config"].update(moe)
        strategy, context = ppo.make_strategy(run_dir, config)
        batch = ppo.fixed_rollout(context.model.config.vocab_size)
        for name in ("advantages", "values", "returns"):
            setattr(batch, name, torch.zeros(batch.response_ids.shape))
        with torch.no_grad():
            losses[coef], metrics = strategy.compute_loss(batch)
    aux = metrics["moe/aux_loss"] + metrics["moe/critic_aux_loss"]
    assert metrics["moe/aux_loss"] > 0 and metrics["moe/critic_aux_loss"] > 0
    torch.testing.assert_close(losses[0.5] - losses[0.0], 0.5 * aux, atol=1e-6, rtol=1e-5)
