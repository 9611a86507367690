"""Native model behaviour: KV cache, packing, padding, MoE routing, aux loss, config rules."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from astrai_core.model import CausalLM, KVCache, ModelConfig, positions_from_attention_mask
from astrai_core.model.moe import RouterOutput, load_balancing_loss, router_statistics
from astrai_core.rollout.batch import pad_rows

DENSE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
             num_kv_heads=2, qk_norm=True, attention_bias=True, rope_theta=1000.0)
MOE = dict(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
           shared_expert_intermediate_size=24)


def make_model(**config) -> CausalLM:
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**config)).eval()
    with torch.no_grad():  # non-trivial norm weights and biases
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.uniform_(0.5, 1.5)
    return model


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = pad_rows(prompts, left=True, pad_value=0, dtype=torch.long)
    return ids, mask.long()


def new_cache(model: CausalLM, batch_size: int, max_length: int) -> KVCache:
    """A KV cache for ``model`` in its weights' dtype and device, as the samplers build it."""
    weight = model.embed.weight
    return KVCache(model.config, batch_size, max_length, dtype=weight.dtype, device=weight.device)


@torch.no_grad()
def greedy_with_cache(model, ids, mask, steps):
    """Greedy decode with the KV cache; returns the full ids and the logits of every step."""
    cache = new_cache(model, ids.shape[0], ids.shape[1] + steps)
    logits = model(ids, attention_mask=mask, position_ids=positions_from_attention_mask(mask),
                   kv_cache=cache)["logits"]
    step_logits = [logits[:, -1]]
    for _ in range(steps):
        token = step_logits[-1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, token], 1)
        mask = torch.cat([mask, torch.ones_like(token)], 1)
        position = positions_from_attention_mask(mask)[:, -1:]
        out = model(token, attention_mask=mask, position_ids=position, kv_cache=cache)["logits"]
        step_logits.append(out[:, -1])
    assert cache.length == ids.shape[1]
    return ids, mask, torch.stack(step_logits[:-1], 1)


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_kv_cache_decode_equals_full_forward_with_left_padding(config):
    model = make_model(**config)
    prompts = [[5, 9, 12, 7, 3], [7, 3], [11, 40, 2]]
    ids, mask = left_padded(prompts)
    full_ids, full_mask, step_logits = greedy_with_cache(model, ids, mask, steps=6)
    with torch.no_grad():
        full = model(full_ids, attention_mask=full_mask,
                     position_ids=positions_from_attention_mask(full_mask))["logits"]
    prompt_len = ids.shape[1]
    expected = full[:, prompt_len - 1:-1]
    assert (step_logits - expected).abs().max().item() <= 1e-5
    # and each row equals that sequence alone, without any padding
    for row, prompt in enumerate(prompts):
        alone = torch.tensor([prompt + full_ids[row, prompt_len:].tolist()])
        with torch.no_grad():
            logits = model(alone)["logits"][0, len(prompt) - 1:-1]
        assert (logits - step_logits[row]).abs().max().item() <= 1e-5


def test_kv_cache_select_drops_rows():
    model = make_model(**MOE)
    ids, mask = left_padded([[5, 9, 12], [7, 3, 4], [11, 40, 2]])
    cache = new_cache(model, 3, 8)
    with torch.no_grad():
        model(ids, attention_mask=mask, kv_cache=cache)
        cache.select(torch.tensor([2, 0]))
        assert cache.batch_size == 2 and cache.length == 3
        next_ids = torch.tensor([[8], [6]])
        got = model(next_ids, kv_cache=cache)["logits"][:, -1]
        full = model(torch.cat([ids[[2, 0]], next_ids], 1))["logits"][:, -1]
    assert (got - full).abs().max().item() <= 1e-5


def test_kv_cache_overflow_raises():
    model = make_model(**DENSE)
    cache = new_cache(model, 1, 4)
    with pytest.raises(ValueError, match="max_length is 4"):
        model(torch.tensor([[1, 2, 3, 4, 5]]), kv_cache=cache)


def test_kv_cache_layout():
    config = ModelConfig(**DENSE)
    cache = KVCache(config, batch_size=3, max_length=10, dtype=torch.float64, device="cpu")
    assert len(cache.keys) == config.num_layers
    assert cache.keys[0].shape == (3, config.num_kv_heads, 10, config.head_dim)
    assert cache.values[1].dtype == torch.float64 and cache.length == 0


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_packed_batch_equals_separate_documents(config):
    model = make_model(**config)
    documents = [[5, 9, 12, 7], [3, 8, 1], [40, 41, 42, 43, 44]]
    packed = torch.tensor([sum(documents, [])])
    positions = torch.tensor([[p for doc in documents for p in range(len(doc))]])
    with torch.no_grad():
        got = model(packed, position_ids=positions)["logits"][0]
        expected = torch.cat([model(torch.tensor([doc]))["logits"][0] for doc in documents])
        unpacked = model(packed)["logits"][0]
    assert (got - expected).abs().max().item() <= 1e-5
    assert (unpacked - expected).abs().max().item() > 1e-3  # the mask matters


def test_padding_does_not_change_logits():
    model = make_model(**MOE)
    sequence = [5, 9, 12, 7, 3, 30]
    with torch.no_grad():
        alone = model(torch.tensor([sequence]))["logits"][0]
        right = model(torch.tensor([sequence + [0, 0]]),
                      attention_mask=torch.tensor([[1] * 6 + [0, 0]]))["logits"][0, :6]
        ids, mask = left_padded([sequence, [1, 2, 3, 4, 5, 6, 7, 8]])
        left = model(ids, attention_mask=mask, position_ids=positions_from_attention_mask(mask))["logits"]
    assert (right - alone).abs().max().item() <= 1e-5
    assert (left[0, 2:] - alone).abs().max().item() <= 1e-5
    assert torch.isfinite(left).all()  # fully masked pad rows give no NaN


def test_hidden_states_and_dense_outputs():
    model = make_model(**DENSE)
    out = model(torch.tensor([[1, 2, 3]]), return_hidden_states=True)
    assert out["hidden_states"].shape == (1, 3, 32)
    expected = out["hidden_states"] @ model.lm_head.weight.T
    assert torch.allclose(out["logits"], expected, atol=1e-6)
    assert out["aux_loss"].shape == () and out["aux_loss"].item() == 0.0
    assert out["router_stats"] == []
    assert "hidden_states" not in model(torch.tensor([[1]]))


def test_load_balancing_loss_and_stats_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1],
                          [0.1, 0.2, 0.6, 0.1],
                          [0.25, 0.25, 0.25, 0.25]])  # the last token is padding
    router = RouterOutput(probs=probs, selected=torch.tensor([[0, 1], [2, 1], [0, 1]]))
    valid = torch.tensor([1, 1, 0])
    # counts over real tokens: e0=1, e1=2, e2=1, e3=0 -> f = [0.5, 1, 0.5, 0]
    # mean probs over real tokens: P = [0.3, 0.25, 0.35, 0.1]
    expected = 4 * (0.5 * 0.3 + 1 * 0.25 + 0.5 * 0.35 + 0 * 0.1)
    assert load_balancing_loss(router, 4, valid).item() == pytest.approx(expected, rel=1e-6)
    stats = router_statistics(router, 4, valid)

    def entropy(row):
        return -sum(p * math.log(p) for p in row)

    expected_entropy = (entropy(probs[0].tolist()) + entropy(probs[1].tolist())) / 2
    assert stats["entropy"].item() == pytest.approx(expected_entropy)
    assert stats["dead_fraction"].item() == 0.25
    assert stats["load_imbalance"].item() == pytest.approx(2 / 1)  # max 2, mean 4 slots / 4 experts


def test_model_aux_loss_is_mean_over_moe_layers():
    model = make_model(**MOE)
    captured = []
    for layer in model.layers:
        layer.mlp.register_forward_hook(lambda module, args, output: captured.append(output[1]))
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    out = model(ids, attention_mask=mask)
    per_layer = [load_balancing_loss(r, 4, mask.reshape(-1)) for r in captured]
    assert len(per_layer) == 2 and len(out["router_stats"]) == 2
    assert torch.allclose(out["aux_loss"], torch.stack(per_layer).mean())
    out["aux_loss"].backward()
    assert model.layers[0].mlp.router.weight.grad.abs().sum() > 0


def test_moe_layer_rule_and_parameter_names():
    model = CausalLM(ModelConfig(**dict(MOE, num_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])))
    assert [layer.is_moe for layer in model.layers] == [False, True, False, False]
    names = model.state_dict()
    assert names["layers.1.mlp.experts.gate_proj"].shape == (4, 16, 32)
    assert names["layers.1.mlp.experts.down_proj"].shape == (4, 32, 16)
    assert names["layers.1.mlp.router.weight"].shape == (4, 32)
    assert names["layers.1.mlp.shared_expert_gate.weight"].shape == (1, 32)
    assert names["layers.0.mlp.gate_proj.weight"].shape == (48, 32)
    assert "layers.0.attn.o_proj.bias" not in names and "layers.0.attn.q_proj.bias" in names


def test_moe_matches_dense_reference_computation():
    model = make_model(**dict(MOE, num_layers=1, shared_expert_intermediate_size=0, norm_topk_prob=False))
    block = model.layers[0].mlp
    x = torch.randn(1, 5, 32)
    got, router = block(x)
    probs = torch.softmax(block.router(x[0]), -1)
    weights, chosen = probs.topk(2, -1)
    experts = block.experts
    expected = torch.zeros(5, 32)
    for t in range(5):
        for w, e in zip(weights[t], chosen[t]):
            hidden = torch.nn.functional.silu(experts.gate_proj[e] @ x[0, t]) * (experts.up_proj[e] @ x[0, t])
            expected[t] += w * (experts.down_proj[e] @ hidden)
    assert torch.allclose(got[0], expected, atol=1e-6)
    assert torch.equal(router.selected, chosen)


def test_gradient_checkpointing_gives_same_gradients():
    model = make_model(**MOE).train()
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def grads():
        model.zero_grad()
        out = model(ids)
        (out["logits"].logsumexp(-1).mean() + out["aux_loss"]).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    model.gradient_checkpointing = True
    checkpointed = grads()
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-6) for n in plain)


def test_init_and_parameter_count():
    model = CausalLM(ModelConfig(**dict(DENSE, tie_word_embeddings=True)))
    state = model.state_dict()
    assert "lm_head.weight" not in state
    assert torch.equal(state["layers.0.attn_norm.weight"], torch.ones(32))
    assert torch.equal(state["layers.0.attn.q_proj.bias"], torch.zeros(32))
    assert abs(state["embed.weight"].std().item() - 0.02) < 0.004
    assert model.num_parameters() == sum(t.numel() for t in state.values())


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(**dict(DENSE, num_kv_heads=3))
    with pytest.raises(ValueError, match="extra"):
        ModelConfig(**DENSE, hidden_act="gelu")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig(**dict(MOE, num_experts_per_tok=5))
    assert ModelConfig(**DENSE).head_dim == 8
    assert ModelConfig(**dict(DENSE, sliding_window=0)).sliding_window is None
    assert ModelConfig(**dict(MOE, moe_intermediate_size=None)).moe_intermediate_size == 48


def test_importing_astrai_core_does_not_import_torch():
    code = ("import sys, astrai_core; "
            "assert 'torch' not in sys.modules and 'astrai_core.model' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
