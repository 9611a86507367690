"""Build the calc example's tokenizer: characters, plus whole tokens for the tool call.

Run: ``python examples/calc/make_tokenizer.py [--out examples/calc/tokenizer]``
(deterministic, offline). Digits, operators and letters are one token each, as in the
arithmetic example, so numbers are read digit by digit. The Hermes tool-call frame is
four whole tokens: ``<tool_call>``, ``{"name": "calculator", "arguments": {"expression": "``,
``"}}`` and ``</tool_call>`` (plain, non-special added tokens: decoding keeps them, so the
Hermes parser sees the call). A call costs the expression's characters plus four tokens.
The chat template is the arithmetic example's; here it has ``system``, ``user``,
``assistant`` and ``tool`` turns::

    <|system|>calculator<|end|><|user|>123*45=<|end|><|assistant|><tool_call>{"name": ...
    ... "123*45"}}</tool_call><|end|><|tool|>5535<|end|><|assistant|>5535<|end|>
"""

from __future__ import annotations

import argparse
import importlib.util
import string
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, trainers

SPECIAL_TOKENS = ["<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
                  "<|end|>"]
CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
TOOL_TOKENS = ["<tool_call>", CALL_OPEN, '"}}', "</tool_call>"]
_ARITH = Path(__file__).resolve().parents[1] / "arith" / "make_tokenizer.py"
_spec = importlib.util.spec_from_file_location("arith_make_tokenizer", _ARITH)
arith = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arith)  # the arithmetic example's chat template and save()

ALPHABET = list(string.digits + string.punctuation + " \n" + string.ascii_letters)


def build_tokenizer() -> Tokenizer:
    """A character BPE (no merges) plus the tool-call tokens."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(ALPHABET), special_tokens=SPECIAL_TOKENS,
        initial_alphabet=ALPHABET, show_progress=False)
    tokenizer.train_from_iterator(["".join(ALPHABET)], trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TOKENS])
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "tokenizer")
    arith.save(parser.parse_args().out, build_tokenizer())  # the same chat template


if __name__ == "__main__":
    main()
