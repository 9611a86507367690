"""Fixtures for the data tests: the arithmetic tokenizer, a ChatML BPE tokenizer with
merges (tokens spanning several characters), and a JSONL writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARITH_TOKENIZER = REPO / "examples" / "arith" / "tokenizer"

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello there, how are you today? i am fine, thank you",
    "what is the capital of france? paris is the capital of france",
    "answer the question with one word please",
    "numbers like 12 and 345 and 6789 are tokens too",
] * 20


@pytest.fixture(scope="session")
def arith_tokenizer():
    from astrai_core.data import load_tokenizer

    return load_tokenizer(ARITH_TOKENIZER)


def _train_chatml(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                            pad_token="<|im_end|>", chat_template=CHATML_TEMPLATE
                            ).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def chatml_dir(tmp_path_factory) -> Path:
    return _train_chatml(tmp_path_factory.mktemp("chatml"))


@pytest.fixture(scope="session")
def chatml_tokenizer(chatml_dir):
    from astrai_core.data import load_tokenizer

    return load_tokenizer(chatml_dir)


@pytest.fixture
def write_jsonl(tmp_path):
    """write_jsonl(name, rows) -> path; a row that is a str is written as a raw line."""

    def write(name: str, rows: list) -> Path:
        path = tmp_path / name
        lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}]}
