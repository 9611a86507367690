"""LoRA checkpoints against peft on Hugging Face: the saved adapter loaded with
``PeftModel.from_pretrained`` on the export of the base computes astrai's logits; the
checkpoint reloads through ``load_pretrained`` (base found by its record); its export is
the merged model; with the adapter disabled the model is the base, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.checkpoints import training_state as ckpt
from astrai_core.checkpoints.hf.select import load_importer
from astrai_core.checkpoints.lora_files import ADAPTER_DIR, BASE_RECORD, attach_lora
from astrai_core.checkpoints.native import load_pretrained
from astrai_core.config.lora import LoraSection
from astrai_core.testing.parity import load_hf_model, padded_batch, save_hf_model, tiny_hf_model
from astrai_core.model.lora import adapter_disabled, adapter_parameters, has_lora
from astrai_core.plugins import process_registry

TOLERANCE = 1e-5
VARIANTS = {  # (model_type, lora options)
    "llama": ("llama", {"r": 4, "alpha": 8.0}),
    "qwen3": ("qwen3", {"r": 4, "alpha": 16.0}),
    "qwen3-rslora-dora": ("qwen3", {"r": 8, "alpha": 8.0, "use_rslora": True, "use_dora": True}),
}


def native_base(tmp_path, model_type):
    importer = load_importer(process_registry(), model_type=model_type)
    save_hf_model(tiny_hf_model(model_type), tmp_path / "hf")
    importer.import_checkpoint(tmp_path / "hf", tmp_path / "native")
    importer.export_checkpoint(tmp_path / "native", tmp_path / "base_export")
    return importer, tmp_path / "native"


def lora_model(base_dir, options, seed=1):
    """The base with a non-trivial adapter (peft starts lora_B at zero: randomise all)."""
    model = attach_lora(load_pretrained(base_dir), LoraSection(**options), base_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in adapter_parameters(model).items():
            noise = torch.randn(param.shape, generator=generator) * 0.1
            param.copy_(1.0 + noise if "magnitude" in name else noise)
    return model.eval()


def save_step(model, tmp_path, base_dir):
    target = tmp_path / "run" / "checkpoints" / "step_1"
    ckpt.save_checkpoint(target, model=model, tokenizer_dir=tmp_path / "hf", extra_modules={},
                         training_state={"step": 1}, summary={"step": 1},
                         initial_model_dir=base_dir)
    return target


def logits(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out["logits"] if isinstance(out, dict) else out.logits


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_saved_adapter_matches_peft_on_the_hugging_face_model(tmp_path, variant):
    from peft import PeftModel

    model_type, options = VARIANTS[variant]
    importer, base_dir = native_base(tmp_path, model_type)
    model = lora_model(base_dir, options)
    step = save_step(model, tmp_path, base_dir)
    ids, mask = padded_batch(model.config.vocab_size, [7, 5, 3])
    expected = logits(model, ids, mask)

    assert not (step / "model.safetensors").exists()  # no second copy of the base
    record = json.loads((step / BASE_RECORD).read_text())
    assert record["path"] == str(base_dir.resolve())
    peft_model = PeftModel.from_pretrained(load_hf_model(tmp_path / "base_export"),
                                           str(step / ADAPTER_DIR)).eval()
    peft_logits = logits(peft_model, ids, mask)
    mask3 = mask.bool()
    assert (peft_logits - expected)[mask3].abs().max().item() < TOLERANCE
    # the adapter is not trivial: the base differs by far more than the tolerance
    base_logits = logits(load_hf_model(tmp_path / "base_export"), ids, mask)
    assert (base_logits - expected)[mask3].abs().max().item() > 100 * TOLERANCE

    reloaded = load_pretrained(step)
    assert has_lora(reloaded)
    assert torch.equal(logits(reloaded, ids, mask), expected)

    importer.export_checkpoint(step, tmp_path / "merged")
    merged = logits(load_hf_model(tmp_path / "merged"), ids, mask)
    assert (merged - expected)[mask3].abs().max().item() < TOLERANCE


def test_disabled_adapter_is_the_base_exactly(tmp_path):
    _, base_dir = native_base(tmp_path, "llama")
    base = load_pretrained(base_dir)
    model = lora_model(base_dir, {"r": 4, "dropout": 0.1})
    ids, mask = padded_batch(base.config.vocab_size, [6, 4])
    with adapter_disabled(model):
        disabled = logits(model, ids, mask)
    assert torch.equal(disabled, logits(base, ids, mask))
    assert not torch.equal(logits(model, ids, mask), disabled)
    assert all(p.requires_grad for p in adapter_parameters(model).values())  # restored


def test_a_moved_base_is_found_by_its_relative_path_and_a_changed_one_is_refused(tmp_path):
    import shutil

    from astrai_core.errors import CheckpointError

    original = tmp_path / "original"
    _, base_dir = native_base(original, "llama")
    model = lora_model(base_dir, {"r": 2})
    save_step(model, original, base_dir)
    ids, mask = padded_batch(model.config.vocab_size, [5])
    expected = logits(model, ids, mask)
    moved = tmp_path / "elsewhere"
    shutil.move(str(original), str(moved))  # run and base travel together
    assert torch.equal(logits(load_pretrained(moved / "run/checkpoints/step_1"), ids, mask),
                       expected)
    weights = moved / "native" / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    tensors["norm.weight"] = tensors["norm.weight"] * 2
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="base checkpoint was not found.*different weights"):
        load_pretrained(moved / "run/checkpoints/step_1")
