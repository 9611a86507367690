"""Sources read through Hugging Face `datasets`: Parquet, JSON, CSV, Arrow, save_to_disk
directories and hub names, with column renames and a row transform. The reference is the
same rows as JSONL: a Parquet SFT run equals the JSONL run bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astrai_core.data.config import DataConfig, SourceConfig
from astrai_core.data.datasets_io import materialize
from astrai_core.errors import DataError
from astrai_core.testing import ARITH_TOKENIZER, REPO_ROOT, TINY_MODEL, write_arith_prompts

datasets = pytest.importorskip("datasets")

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a % 3}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _written(tmp_path: Path, kind: str) -> Path | str:
    dataset = datasets.Dataset.from_list(ROWS)
    if kind == "parquet":
        dataset.to_parquet(str(tmp_path / "d.parquet"))
        return tmp_path / "d.parquet"
    if kind == "json":
        (tmp_path / "d.json").write_text(json.dumps(ROWS))
        return tmp_path / "d.json"
    if kind == "csv":
        dataset.to_csv(str(tmp_path / "d.csv"), index=False)
        return tmp_path / "d.csv"
    if kind == "save_to_disk":
        dataset.save_to_disk(str(tmp_path / "saved"))
        return tmp_path / "saved"
    if kind == "dataset_dict":
        datasets.DatasetDict({"train": dataset.select([0]), "test": dataset}).save_to_disk(
            str(tmp_path / "dd"))
        return tmp_path / "dd"
    if kind == "arrow":
        dataset.save_to_disk(str(tmp_path / "saved_arrow"))
        return next((tmp_path / "saved_arrow").glob("*.arrow"))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["parquet", "json", "csv", "save_to_disk", "arrow"])
def test_every_file_kind_gives_the_rows_of_the_jsonl(tmp_path, kind):
    source = SourceConfig(path=_written(tmp_path, kind), format="prompt")
    rows = _rows(materialize(source, tmp_path / "cache", "data.sources[0].path"))
    if kind == "csv":  # CSV has no types: pandas infers them ("3" reads back as 3)
        rows = [{**row, "answer": str(row["answer"])} for row in rows]
    assert rows == ROWS


def test_a_dataset_dict_directory_reads_its_split(tmp_path):
    path = _written(tmp_path, "dataset_dict")
    assert _rows(materialize(SourceConfig(path=path, format="prompt", split="test"),
                             tmp_path / "c", "f")) == ROWS
    with pytest.raises(DataError, match=r"has splits train, test, not 'validation'"):
        materialize(SourceConfig(path=path, format="prompt", split="validation"),
                    tmp_path / "c", "data.eval.path")


def make_chat(row: dict) -> dict:
    """A transform: a question/answer row to a chat row."""
    return {"messages": [{"role": "user", "content": row["prompt"]},
                         {"role": "assistant", "content": row["answer"]}]}


def test_renames_and_transform_apply_in_order_and_key_the_cache(tmp_path):
    rows = [{"question": r["prompt"], "answer": r["answer"]} for r in ROWS]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "q.parquet"))
    renamed = SourceConfig(path=tmp_path / "q.parquet", format="prompt",
                           columns={"question": "prompt"})
    first = materialize(renamed, tmp_path / "c", "data.sources[0].path")
    assert _rows(first) == [{"prompt": r["prompt"], "answer": r["answer"]} for r in ROWS]
    assert materialize(renamed, tmp_path / "c", "data.sources[0].path") == first  # cached
    chat = SourceConfig(path=tmp_path / "q.parquet", format="chat", columns={"question": "prompt"},
                        transform=f"{__name__}:make_chat")
    second = materialize(chat, tmp_path / "c", "data.sources[0].path")
    assert second != first and _rows(second) == [make_chat(r) for r in _rows(first)]
    with pytest.raises(DataError, match=r"data.sources\[0\].columns: no column 'questio' to "
                       r"rename; the columns are question, answer"):
        materialize(SourceConfig(path=tmp_path / "q.parquet", format="prompt",
                                 columns={"questio": "prompt"}), tmp_path / "c",
                    "data.sources[0].path")


def test_a_bad_row_names_the_file_and_the_row_index(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                            "content": "yo"}]}] * 2
    rows.append({"messages": [{"role": "user", "content": "no answer"}]})
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "chat.parquet"))
    with pytest.raises(DataError, match=rf"data source {tmp_path}/chat.parquet, row 2: "
                       "'messages' has no assistant message"):
        materialize(SourceConfig(path=tmp_path / "chat.parquet", format="chat"),
                    tmp_path / "c", "data.sources[0].path")


def test_parquet_prompt_rows_missing_messages_is_not_a_misleading_line_error(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "p.parquet"))
    with pytest.raises(DataError, match=r"row 0: missing field 'messages'$"):
        materialize(SourceConfig(path=tmp_path / "p.parquet", format="chat"), tmp_path / "c",
                    "data.sources[0].path")


def test_a_hub_name_offline_is_one_error_line(tmp_path):
    prompts = write_arith_prompts(tmp_path / "p.jsonl")
    config = _sft_config(tmp_path, "hf://astrai-test/no-such-dataset", "prompt")
    config["strategy"] = {"name": "grpo", "group_size": 2}
    config["rewards"] = [{"name": "exact_match"}]
    config["sampler"] = {"name": "torch", "max_new_tokens": 8}  # fits the 64-token context
    config["data"]["eval"] = {"path": str(prompts), "format": "prompt"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "hub dataset 'astrai-test/no-such-dataset'" in errors[0]
    assert "HF_HUB_OFFLINE=1" in errors[0] and "local Hugging Face cache" in errors[0]


def _sft_config(tmp_path: Path, data: Path | str, fmt: str = "chat") -> dict:
    return {
        "output_dir": str(tmp_path / "run"),
        "model": {"tokenizer": str(ARITH_TOKENIZER), "config": dict(TINY_MODEL)},
        "data": {"sources": [{"path": str(data), "format": fmt}], "seq_len": 64,
                 "batch_size": 4, "cache_dir": str(tmp_path / "cache")},
        "strategy": {"name": "sft"},
        "device": {"name": "cpu"},
        "trainer": {"max_steps": 6, "lr": 3e-3, "eval_at_start": False, "progress": False},
    }


def test_an_sft_run_from_parquet_equals_the_run_from_jsonl_bit_for_bit(tmp_path):
    from astrai_core.config.schema import RunConfig
    from astrai_core.training.run import train

    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "arith" / "generate.py"),
                    "--out", str(tmp_path / "data"), "--seed", "0", "--n-train", "64",
                    "--n-eval", "4", "--n-rl", "4"], check=True, capture_output=True)
    jsonl = tmp_path / "data" / "sft_train.jsonl"
    datasets.Dataset.from_json(str(jsonl)).to_parquet(str(tmp_path / "sft.parquet"))
    runs = {}
    for name, data in (("jsonl", jsonl), ("parquet", tmp_path / "sft.parquet")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        train(RunConfig.model_validate(_sft_config(run_dir, data)))
        runs[name] = run_dir / "run"
    files = ("checkpoints/step_6/model.safetensors", "metrics.jsonl")
    losses = [[json.loads(line)["loss"] for line in (runs[n] / "metrics.jsonl").read_text()
               .splitlines()] for n in runs]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    assert (runs["jsonl"] / files[0]).read_bytes() == (runs["parquet"] / files[0]).read_bytes()


def test_the_config_keeps_hub_names_and_resolves_files(tmp_path):
    config = DataConfig.model_validate({"sources": [
        {"path": "hf://openai/gsm8k", "subset": "main", "format": "prompt"},
        {"path": "rel.parquet", "format": "prompt"}]}).resolve_paths(tmp_path)
    assert config.sources[0].path == "hf://openai/gsm8k"
    assert config.sources[1].path == tmp_path / "rel.parquet"


def test_an_unreachable_hub_is_one_quick_line_without_retries(tmp_path):
    """HF_HUB_OFFLINE unset and no hub answering (here: a closed local port as the
    endpoint): the hub is probed once and only the local cache is read, instead of
    huggingface_hub's back-off retries (tens of seconds of "Retrying in" lines)."""
    import socket
    import time

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = _sft_config(tmp_path, "hf://astrai-test/no-such-dataset", "chat")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf_home"))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path)],
                            env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Retrying" not in result.stderr, result.stderr[-2000:]
    assert "the hub was unreachable: only the local cache was read" in errors[0]
    assert took < 20, took  # the retries alone took ~26 s


def test_a_parquet_prompt_row_without_answer_names_the_users_file_and_row(tmp_path):
    from astrai_core.data.build import build_train_loader
    from astrai_core.data.tokenizer import load_tokenizer

    rows = [dict(r) for r in ROWS]
    rows[2]["answer"] = None  # Arrow gives every row the column: this one has no value
    parquet = tmp_path / "prompts.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    cfg = DataConfig(sources=[SourceConfig(path=parquet, format="prompt")], batch_size=2,
                     cache_dir=tmp_path / "cache")
    with pytest.raises(DataError) as raised:
        build_train_loader(cfg, load_tokenizer(ARITH_TOKENIZER),
                           required_columns={"exact_match": ("answer",)})
    assert str(raised.value).startswith(
        f"data source {parquet}, row 2 (data.sources[0].path): a null in column 'answer', which "
        "reward 'exact_match' needs"), str(raised.value)
