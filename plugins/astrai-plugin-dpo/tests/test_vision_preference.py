"""dpo, simpo, kto and orpo on preference and unpaired rows whose prompts hold images, on
tiny vision-language models: the DPO loss equals one computed from transformers' own
forward (model(input_ids, pixel_values, ...) log-probs summed over each response), the
images reach the forward (another image, another loss), kto/simpo/orpo train a step, and
a missing image stops `astrai train` with one line (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

from astrai_core.config.schema import RunConfig
from astrai_core.testing import build_strategy, read_metrics
from astrai_core.testing.hf_vlms import tiny_image
from astrai_core.testing.vlm_rows import (transformers_inputs, vlm_run_config,
                                          write_image_pairs, write_vlm_dirs)
from astrai_core.training.run import train

ROWS = 4
BETA = 0.5


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    return write_vlm_dirs(tmp_path_factory.mktemp("vlms"))


def _perturb(module, scale=0.05):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))


def _transformers_logp(hf, processor, i, answer):
    """transformers' forward on row i's prompt and ``answer``, as its processor makes the
    inputs: the answer's tokens' log-probs (and the end token's), summed."""
    inputs = transformers_inputs(processor, i, answer)
    n = len(processor.tokenizer(f"{answer}<|end|>", add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logits = hf(**inputs).logits[0, -n - 1:-1].double()
    targets = inputs["input_ids"][0, -n:]
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum()


@pytest.mark.parametrize("family", ["gemma3", "llava", "idefics3"])
def test_dpo_loss_on_images_equals_transformers_forward(tmp_path, vlm_dirs, family):
    from transformers import AutoProcessor

    data = write_image_pairs(tmp_path / "data")
    config = vlm_run_config(tmp_path, vlm_dirs[family], data, {"name": "dpo", "beta": BETA})
    strategy, run = build_strategy(config, tmp_path)
    _perturb(strategy.reference)  # a reference other than the policy: a loss not log 2
    batch = strategy.batch_source().next_step()[0]
    loss, _ = strategy.compute_loss(batch)

    processor = AutoProcessor.from_pretrained(str(vlm_dirs[family]))
    policy, reference = run.model.hf, strategy.reference.hf
    margins = []
    for i in range(ROWS):
        chosen, rejected = (
            _transformers_logp(policy, processor, i, str(a)) - _transformers_logp(
                reference, processor, i, str(a)) for a in (i + 1, i + 2))
        margins.append(chosen - rejected)
    expected = -F.logsigmoid(BETA * torch.stack(margins)).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)

    # the images reach the forward: each row given another row's image, another loss
    swapped = dict(batch)
    for key in [k for k in batch if k.endswith("image/pixel_values")]:
        swapped[key] = batch[key].roll(1, dims=0)
    with torch.no_grad():
        other, _ = strategy.compute_loss(swapped)
    assert abs(other.item() - loss.item()) > 1e-4


@pytest.mark.parametrize("strategy", [{"name": "dpo", "loss_type": "simpo"}, {"name": "orpo"},
                                      {"name": "kto"}])
def test_simpo_orpo_and_kto_train_on_image_rows(tmp_path, vlm_dirs, strategy):
    unpaired = strategy["name"] == "kto"
    data = write_image_pairs(tmp_path / "data", unpaired=unpaired)
    config = vlm_run_config(tmp_path, vlm_dirs["gemma3"], data, strategy,
                            data_format="unpaired" if unpaired else "preference")
    train(RunConfig.model_validate(config))
    losses = [record["loss"] for record in read_metrics(tmp_path / "run")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_kto_mismatched_rows_keep_their_prompts_images(tmp_path, vlm_dirs):
    from astrai_plugin_dpo.kto import mismatched_batch

    data = write_image_pairs(tmp_path / "data", unpaired=True)
    config = vlm_run_config(tmp_path, vlm_dirs["gemma3"], data, {"name": "kto"},
                            data_format="unpaired")
    strategy, _ = build_strategy(config, tmp_path)
    batch = strategy.batch_source().next_step()[0]
    mismatched = mismatched_batch(batch)
    assert torch.equal(mismatched["image/pixel_values"], batch["image/pixel_values"])
    types, ids = mismatched["image/token_type_ids"], mismatched["input_ids"]
    image_token = strategy.run.model.hf.config.image_token_id
    assert torch.equal(types.bool(), ids == image_token)  # image tokens only, in the prompt


def test_images_in_a_response_are_refused(tmp_path, vlm_dirs):
    from astrai_core.data.tokenize import tokenize_source
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.errors import DataError

    tiny_image(0).save(tmp_path / "0.png")
    row = {"prompt": [{"role": "user", "content": "1+1=?"}], "chosen": [{"role": "assistant", "content": [
        {"type": "image_url", "image_url": {"url": "0.png"}}]}], "rejected": "3"}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match="line 1: field 'chosen' holds an image; images go in "
                                        "the prompt"):
        tokenize_source(path, "preference", load_tokenizer(vlm_dirs["llava"]), tmp_path / "c")


def test_a_missing_image_is_one_line_and_exit_code_2(tmp_path, vlm_dirs):
    data = write_image_pairs(tmp_path / "data")
    rows = data.read_text().splitlines()
    row = json.loads(rows[0])
    row["prompt"][0]["content"][0]["image_url"]["url"] = "gone.png"
    rows[0] = json.dumps(row)
    data.write_text("\n".join(rows) + "\n")
    config = vlm_run_config(tmp_path, vlm_dirs["llava"], data, {"name": "dpo"})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: data file {data}, line 1: image gone.png cannot be read "
                      "(no such file)"]
    assert not (tmp_path / "run" / "checkpoints").exists()
