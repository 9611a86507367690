"""The Geometry3K recipe's config runs 2 GRPO steps on CPU: a tiny random Gemma 3 (the
test kit's) and a local parquet file in the dataset's shape (an `images` list of PNG
bytes, `problem` with its `<image>` marker, `answer`), read through the recipe's own
`columns` and `transform` for training and for its evaluation set. The recipe runs 8
processes; here one stands in. The math_verify reward scores the samples."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.slow
datasets = pytest.importorskip("datasets")
pytest.importorskip("math_verify")

from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir  # noqa: E402
from astrai_core.testing.recipes import recipe_astrai  # noqa: E402
from astrai_core.testing.runs import REPO_ROOT  # noqa: E402

GEO3K = REPO_ROOT / "examples" / "geo3k"


def _parquet(path, rows: int = 6) -> None:
    """Geometry3K's columns and types: images (a list of Image), problem, answer."""
    import io

    features = datasets.Features({"images": datasets.Sequence(datasets.Image()),
                                  "problem": datasets.Value("string"),
                                  "answer": datasets.Value("string")})
    records = []
    for i in range(rows):
        png = io.BytesIO()
        tiny_image(i).save(png, format="PNG")
        records.append({"images": [{"bytes": png.getvalue(), "path": None}],
                        "problem": f"<image>Find x. {i}+1=", "answer": str(i + 1)})
    datasets.Dataset.from_list(records, features=features).to_parquet(str(path))


def smoke_config(root) -> dict:
    """The recipe's config as written, with only what a 2-step CPU run must change."""
    config = yaml.safe_load((GEO3K / "grpo.yaml").read_text())
    config["output_dir"] = "runs/geo3k"
    # the instruction is ~250 of its character tokens
    model = write_vlm_dir(root / "tiny-vlm", "gemma3", text={"max_position_embeddings": 640})
    config["model"].update(path=str(model), dtype="float32")
    (source,) = config["data"]["sources"]
    assert source["columns"] == {"problem": "prompt"} and source["path"] == "hf://hiyouga/geometry3k"
    _parquet(root / "train.parquet")
    source.update(path=str(root / "train.parquet"))
    source.pop("split")
    config["data"]["eval"].update(path=str(root / "train.parquet"))
    config["data"]["eval"].pop("split")
    config["data"].update(batch_size=2, max_prompt_len=512, cache_dir=str(root / "cache"))
    assert config["sampler"]["name"] == "torch"
    config["sampler"].update(max_new_tokens=6)
    config["device"] = {"name": "cpu"}
    config["parallel"]["activation_checkpointing"] = False
    config["trainer"].update(max_steps=2, mixed_precision="no", save_every=2, keep_last=None,
                             progress=False, threads=1, eval_every=2,
                             eval_max_new_tokens=6)
    return config


def test_the_recipe_runs_two_grpo_steps_on_image_prompts(tmp_path):
    config = smoke_config(tmp_path)
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(config))
    recipe_astrai("train", str(path), cwd=tmp_path, recipe=GEO3K)
    run = tmp_path / "runs" / "geo3k"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("rollout/reward/math_verify" in r for r in records)
    assert "eval/accuracy" in records[-1]  # the test split's prompts, with their diagrams
    assert (run / "checkpoints" / "step_2" / "model.safetensors").is_file()
    # the transform's prompt: the diagram's tokens, then the question without its marker
    cached = [json.loads(line) for file in (tmp_path / "cache").rglob("records.jsonl")
              for line in file.read_text().splitlines()]
    assert len(cached) == 6
    for record in cached:
        text = record["prompt_text"]
        assert text.startswith("<|user|><start_of_image>Find x.") and "<image>" not in text
        assert text.endswith("MUST BE put in \\boxed{}.<|end|><|assistant|>")
    assert {r["columns"]["answer"] for r in cached} == {str(i + 1) for i in range(6)}
