"""`astrai generate MODEL_DIR --prompt TEXT`: sample from a native checkpoint, streaming tokens."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from astrai_core.cli.inference import add_verify_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="native checkpoint directory")
    parser.add_argument("--prompt", required=True, help="the user message (or raw text with --no-chat-template)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-chat-template", action="store_true",
                        help="feed the prompt as raw text even when the tokenizer has a chat template")
    parser.add_argument("--device", default="auto", help="device backend name (auto, cpu, cuda, ...)")
    add_verify_argument(parser)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from astrai_core.cli.inference import load_model_and_tokenizer
    from astrai_core.errors import ConfigError
    from astrai_core.sampling import SamplingParams

    try:
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    except ValidationError as err:
        problem = err.errors()[0]
        raise ConfigError(f"--{str(problem['loc'][0]).replace('_', '-')}: {problem['msg']}") from None
    model, tokenizer = load_model_and_tokenizer(Path(args.model_dir), args.device,
                                                verify=args.verify)
    prompt_ids = _encode(tokenizer, args.prompt, use_chat_template=not args.no_chat_template)
    if tokenizer.eos_token_id is not None:
        params = params.model_copy(update={"stop_token_ids": (tokenizer.eos_token_id,)})
    _generate_streaming(model, tokenizer, prompt_ids, params)
    return 0


def _encode(tokenizer, prompt: str, use_chat_template: bool) -> list[int]:
    """Token ids of the prompt: a user turn plus the generation prompt when there is a template."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def _generate_streaming(model, tokenizer, prompt_ids: list[int], params) -> None:
    """Print the completion as it is produced: decode all tokens so far, print the new text."""
    from astrai_core.sampling.torch_sampler import TorchSampler

    tokens: list[int] = []
    printed = ""

    def on_token(_index: int, token: int) -> None:
        nonlocal printed
        tokens.append(token)
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        # A partial multi-byte character decodes to U+FFFD: wait for the rest of it.
        if text.startswith(printed) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text

    completion = TorchSampler(model=model, tokenizer=tokenizer).generate([prompt_ids], params, on_token)[0]
    if completion.text and completion.text.startswith(printed):
        sys.stdout.write(completion.text[len(printed):])
    sys.stdout.write("\n")
    sys.stdout.flush()
