"""Train the arithmetic example's tiny character-level tokenizer (deterministic, offline).

Run: ``python examples/arith/make_tokenizer.py [--out examples/arith/tokenizer]``.
Every digit, operator and letter is its own token (a BPE model trained with no merges),
so the model sees numbers digit by digit. The chat template wraps turns as
``<|user|>12+35=<|end|><|assistant|>47<|end|>``; ``{% generation %}`` marks the
assistant tokens that carry the SFT loss.
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, trainers

SPECIAL_TOKENS = ["<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
ALPHABET = list(string.digits + "+-*/=()?.,: " + "\n" + string.ascii_lowercase)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|assistant|>{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{%- else -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def build_tokenizer() -> Tokenizer:
    """A BPE tokenizer whose vocabulary is exactly the specials plus the alphabet."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(ALPHABET),  # no room for merges
        special_tokens=SPECIAL_TOKENS, initial_alphabet=ALPHABET, show_progress=False)
    tokenizer.train_from_iterator(["".join(ALPHABET)], trainer=trainer)
    return tokenizer


def save(out_dir: Path, tokenizer: Tokenizer | None = None) -> None:
    """Save ``tokenizer`` (default: this example's) with the chat template, as transformers
    loads it."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer or build_tokenizer(), pad_token="<pad>", unk_token="<unk>",
        eos_token="<|end|>", chat_template=CHAT_TEMPLATE, model_max_length=1024,
        clean_up_tokenization_spaces=False)
    wrapped.save_pretrained(str(out_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "tokenizer")
    save(parser.parse_args().out)


if __name__ == "__main__":
    main()
