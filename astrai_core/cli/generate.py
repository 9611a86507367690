"""`astrai generate MODEL_DIR --prompt TEXT`: sample from a native checkpoint, streaming tokens.

``--image FILE`` (repeatable) puts images before the prompt's text in the user message of
a vision-language model: the chat template writes the family's image placeholder for each,
and the model's processor expands it into the image's tokens and makes its pixel inputs,
as for a training row (:mod:`astrai_core.data.vision_render`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
    parser.add_argument("--image", action="append", default=[], metavar="FILE",
                        help="an image before the prompt's text (repeat for several); a "
                        "vision-language model's checkpoint")
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
    if args.image and args.no_chat_template:
        raise ConfigError("--image: the chat template places each image's tokens; leave out "
                          "--no-chat-template")
    model, tokenizer = load_model_and_tokenizer(Path(args.model_dir), args.device,
                                                verify=args.verify)
    images = None
    if args.image:
        prompt_ids, images = image_prompt(tokenizer, args.prompt, args.image)
    else:
        prompt_ids = _encode(tokenizer, args.prompt, use_chat_template=not args.no_chat_template)
    if tokenizer.eos_token_id is not None:
        params = params.model_copy(update={"stop_token_ids": (tokenizer.eos_token_id,)})
    _generate_streaming(model, tokenizer, prompt_ids, params, images)
    return 0


def image_prompt(tokenizer: Any, prompt: str, files: list[str]
                 ) -> tuple[list[int], dict[str, Any]]:
    """(prompt ids, image inputs) of one user message: the images of ``files`` (paths from
    the current directory), then ``prompt``; a ConfigError naming ``--image`` when the
    model takes no images or a file cannot be read as an image."""
    from astrai_core.data.images import open_row_images
    from astrai_core.data.vision_render import process_prompt, processor_of
    from astrai_core.errors import ConfigError

    processor = processor_of(tokenizer)
    if processor is None:
        raise ConfigError("--image: this model takes no images (a text-only model; a "
                          "vision-language model's checkpoint has an image processor)")
    images = open_row_images(files, Path.cwd(), "--image")
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         add_generation_prompt=True, tokenize=False)
    return process_prompt(processor, text, images)


def _encode(tokenizer, prompt: str, use_chat_template: bool) -> list[int]:
    """Token ids of the prompt: a user turn plus the generation prompt when there is a template."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def _generate_streaming(model, tokenizer, prompt_ids: list[int], params,
                        images: dict[str, Any] | None = None) -> None:
    """Print the completion as it is produced: decode all tokens so far, print the new text.
    ``images``: the prompt's image inputs (a vision-language model's)."""
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

    completion = TorchSampler(model=model, tokenizer=tokenizer).generate(
        [prompt_ids], params, on_token, images=None if images is None else [images])[0]
    if completion.text and completion.text.startswith(printed):
        sys.stdout.write(completion.text[len(printed):])
    sys.stdout.write("\n")
    sys.stdout.flush()
