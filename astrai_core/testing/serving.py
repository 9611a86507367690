"""Tiny servable checkpoints for the serving tests and benchmark (offline, deterministic).

:func:`build_chat_tokenizer` trains a small byte-level BPE tokenizer (so a character
outside its merges, such as an emoji, spans several tokens) with a Qwen-style chat
template that renders ``tools`` and Hermes tool calls. :func:`build_checkpoint` writes a
random native model with it; :func:`train_to_replay` then fits the model briefly so that
greedy decoding of a prompt replays a fixed answer (a tool call, for the end-to-end test).
:func:`live_server` runs uvicorn over a checkpoint in a thread, for clients in-process;
:func:`wait_for_stats` waits for an engine to reach a state.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{% endif %}"
    "{%- for call in message.tool_calls %}{%- if call.function is defined %}{% set call = call.function %}{% endif %}"
    "\n<tool_call>\n{\"name\": \"{{ call.name }}\", \"arguments\": {{ call.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "You are a helpful assistant. You may call one or more functions to assist with the user query.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
    "The quick brown fox jumps over the lazy dog. What is the weather like in Paris today?",
    "Hello! How can I help you? Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100. Tell me a story about a cat.",
]


def build_chat_tokenizer(directory: str | Path, vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer with the Qwen-style template, saved to ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>", chat_template=QWEN_STYLE_TEMPLATE,
                                      model_max_length=4096, clean_up_tokenization_spaces=False)
    wrapped.save_pretrained(str(directory))
    return wrapped


def build_checkpoint(directory: str | Path, *, hidden_size: int = 32, num_layers: int = 2,
                     max_position_embeddings: int = 1024, seed: int = 0, std: float = 0.3) -> Path:
    """A random native checkpoint with :func:`build_chat_tokenizer`'s tokenizer.

    A large init ``std`` makes next-token distributions peaked, so greedy choices are not
    near-ties (batched and solo decoding then agree token for token).
    """
    import tempfile

    import torch

    from astrai_core.model import CausalLM, ModelConfig
    from astrai_core.checkpoints.native import save_pretrained

    with tempfile.TemporaryDirectory() as tokenizer_dir:
        tokenizer = build_chat_tokenizer(tokenizer_dir)
        torch.manual_seed(seed)
        config = ModelConfig(vocab_size=len(tokenizer), hidden_size=hidden_size,
                             intermediate_size=hidden_size * 2, num_layers=num_layers, num_heads=4,
                             num_kv_heads=2, max_position_embeddings=max_position_embeddings)
        model = CausalLM(config)
        model.reset_parameters(std=std)
        return save_pretrained(model, directory, tokenizer_dir=tokenizer_dir)


def train_to_replay(directory: str | Path, examples: list[tuple[list[int], list[int]]],
                    steps: int = 40, lr: float = 1e-2) -> None:
    """Fit the checkpoint at ``directory`` so greedy decoding of each prompt gives its answer.

    ``examples``: (prompt ids, answer ids). Loss on the answer tokens only; the checkpoint
    is rewritten in place.
    """
    import tempfile

    import torch

    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.checkpoints.native import copy_tokenizer_files, save_pretrained

    model = load_pretrained(directory).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rows = [(torch.tensor([p + a]), len(p)) for p, a in examples]
    for _ in range(steps):
        optimizer.zero_grad()
        for ids, prompt_len in rows:
            logits = model(ids[:, :-1])["logits"][0, prompt_len - 1:]
            torch.nn.functional.cross_entropy(logits, ids[0, prompt_len:]).backward()
        optimizer.step()
    with tempfile.TemporaryDirectory() as keep:  # the tokenizer files, while the directory is replaced
        copy_tokenizer_files(Path(directory), Path(keep))
        save_pretrained(model.eval(), directory, tokenizer_dir=keep, overwrite=True)


class LiveServer:
    """uvicorn serving ``model_dir`` in a thread on 127.0.0.1, at a free port, with
    ``limits`` (a :class:`~astrai_core.serving.limits.ServeLimits`; default: the CLI's).

    The listening socket is bound before the server thread starts, so a client can
    connect at once (the connection waits in the backlog): no polling for readiness.
    """

    def __init__(self, model_dir: Path, name: str = "tiny", max_batch_size: int = 32,
                 max_queued: int | None = None, max_seqs_per_request: int = 256, limits=None) -> None:
        import uvicorn

        from astrai_core.checkpoints.native import load_pretrained
        from astrai_core.cli.serve import engine_for
        from astrai_core.data.tokenizer import load_tokenizer
        from astrai_core.plugins import process_registry
        from astrai_core.serving.app import create_app
        from astrai_core.serving.connections import server_config
        from astrai_core.serving.limits import ServeLimits

        self.model = load_pretrained(model_dir).eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.engine = engine_for(self.model, self.tokenizer,
                                 process_registry().get("sampler", "torch"), max_batch_size,
                                 max_queued)
        self.name = name
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(512)
        self.port = self.socket.getsockname()[1]
        self.limits = limits or ServeLimits()
        app = create_app(self.engine, model_name=name, max_seqs_per_request=max_seqs_per_request,
                         limits=self.limits)
        self.server = uvicorn.Server(server_config(app, self.limits, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def async_client(self):
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def chat_prompt_ids(self, messages, tools=None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.close()
        self.socket.close()


@contextmanager
def live_server(model_dir: Path, **kwargs):
    server = LiveServer(model_dir, **kwargs)
    try:
        yield server
    finally:
        server.close()


def wait_for_stats(engine: Any, predicate: Callable[[Any], bool], timeout: float = 60.0,
                   interval: float = 0.005) -> bool:
    """Poll ``engine.stats()`` until ``predicate`` holds (True) or ``timeout`` seconds
    pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate(engine.stats()):
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
