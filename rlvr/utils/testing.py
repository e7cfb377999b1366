"""Helpers for tests: a tiny deterministic tokenizer and a tiny random Llama model, built
without any network access, and a local stub of an OpenAI-compatible judge server."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "tiny_tokenizer",
    "tiny_causal_lm",
    "save_tiny_model",
    "save_tiny_reward_model",
    "RM_CHAT_TEMPLATE",
    "judge_stub_server",
    "openai_stub_server",
    "StubReply",
    "local_ray_cluster",
    "forward_log_probs",
]

PAD, BOS, IM_START, IM_END = "<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, IM_START, IM_END]

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


RM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '### ' + message['role'] + ': ' + message['content'] + '\n' }}"
    "{% endfor %}{{ '### end' }}"
)
"""A chat template unlike :data:`TINY_CHAT_TEMPLATE` (a reward model's own format, opening with BOS)."""


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0-3 are ``<pad>``, ``<|endoftext|>`` (BOS), ``<|im_start|>``,
    ``<|im_end|>`` (EOS), ids 4-259 one per byte. It encodes any text and decodes it back exactly,
    and has a ChatML chat template (like SmolLM2). ``len(tokenizer) == 260``.
    """
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: len(SPECIAL_TOKENS) + i for i, char in enumerate(byte_chars)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=IM_END,
        additional_special_tokens=[IM_START],
        padding_side="right",
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def tiny_causal_lm(
    vocab_size: int | None = None,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A small random Llama model and the matching :func:`tiny_tokenizer`.

    The weights depend only on ``seed`` (the global RNG is left untouched).

    Args:
        vocab_size: model vocabulary, at least ``len(tokenizer)`` (260); None uses exactly that.
    """
    tokenizer = tiny_tokenizer()
    vocab_size = len(tokenizer) if vocab_size is None else vocab_size
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tiny tokenizer's {len(tokenizer)} tokens")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def save_tiny_model(path: str | os.PathLike, **kwargs) -> Path:
    """Write :func:`tiny_causal_lm` (``**kwargs`` passed on) and its tokenizer to the folder
    ``path``, loadable with :func:`rlvr.utils.model.load_causal_lm`; returns the folder."""
    path = Path(path)
    model, tokenizer = tiny_causal_lm(**kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_reward_model(path: str | os.PathLike, seed: int = 1, num_labels: int = 1,
                           chat_template: str | None = RM_CHAT_TEMPLATE, hidden_size: int = 32) -> Path:
    """Write a small random ``LlamaForSequenceClassification`` (``num_labels`` outputs, the weights
    depending only on ``seed``) and :func:`tiny_tokenizer` with ``chat_template`` to the folder
    ``path``; returns the folder."""
    path = Path(path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = chat_template
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, num_labels=num_labels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        torch.nn.init.normal_(model.score.weight, std=0.5)  # scores of order 1, not ~0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@torch.no_grad()
def forward_log_probs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Log-prob ``[b, R]`` of each response token under ``softmax(logits / temperature)`` from one
    plain fp32 forward of a rollout's sequences (``input_ids``, ``attention_mask``, ``position_ids``
    ``[b, P+R]``, ``responses`` ``[b, R]``): the reference for a rollout engine's log-probs."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits.float()
    responses = batch["responses"]
    logits = logits[:, -responses.shape[1] - 1 : -1] / temperature
    return logits.log_softmax(-1).gather(-1, responses[..., None]).squeeze(-1)


@dataclass
class StubReply:
    """What the OpenAI-compatible stub answers to one request: an HTTP ``status``, the assistant
    message ``content`` (a 200 only), after ``delay_s`` seconds."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0


@dataclass
class StubLog:
    """What the stub received: ``requests`` as ``(path, Authorization header or None, JSON body)`` in
    arrival order, and the most requests it had in flight at once (``max_in_flight``)."""

    requests: list = field(default_factory=list)
    max_in_flight: int = 0
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def openai_stub_server(answer: Callable[[dict, int], StubReply]) -> Iterator[tuple[str, StubLog]]:
    """Serve an OpenAI-compatible ``/v1/chat/completions`` stub on a free local port while the block runs.

    Args:
        answer: ``(request body, number of the request from 0) -> StubReply``; a 200 answers
            ``{"choices": [{"message": {"role": "assistant", "content": ...}}]}``, any other status
            an error body with that status.

    Yields:
        ``(api_base, log)``: ``http://127.0.0.1:<port>/v1`` and the :class:`StubLog`.
    """
    log = StubLog()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with log.lock:
                number = len(log.requests)
                log.requests.append((self.path, self.headers.get("Authorization"), body))
                log.in_flight += 1
                log.max_in_flight = max(log.max_in_flight, log.in_flight)
            try:
                reply = answer(body, number)
                time.sleep(reply.delay_s)
            finally:  # counted as in flight until answered (not while the answer is sent: the client is done)
                with log.lock:
                    log.in_flight -= 1
            payload = ({"choices": [{"message": {"role": "assistant", "content": reply.content}}]}
                       if reply.status == 200 else {"error": {"message": f"stub status {reply.status}"}})
            data = json.dumps(payload).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (its time limit)
                pass

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", log
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def judge_stub_server(reply: Callable[[str], str]) -> Iterator[tuple[str, list[tuple[str, str | None, dict]]]]:
    """:func:`openai_stub_server` answering ``reply(prompt)`` to every request, ``prompt`` being the
    content of the request's first message.

    Yields:
        ``(api_base, requests)``: ``http://127.0.0.1:<port>/v1`` and the list of received
        requests as ``(path, Authorization header or None, JSON body)``, in arrival order.
    """
    with openai_stub_server(lambda body, _: StubReply(reply(body["messages"][0]["content"]))) as (url, log):
        yield url, log.requests


@contextmanager
def local_ray_cluster(num_cpus: int, pickle_by_value: tuple = ()) -> Iterator[None]:
    """A local Ray cluster of ``num_cpus`` CPUs for the duration of the block (joined if one runs).

    Args:
        num_cpus: CPUs of the cluster (tests use 2).
        pickle_by_value: modules the Ray workers cannot import (test folders), shipped by value.
    """
    import ray
    import ray.cloudpickle

    from rlvr.single_controller import init_ray

    for module in pickle_by_value:
        ray.cloudpickle.register_pickle_by_value(module)
    started = not ray.is_initialized()
    init_ray(num_cpus=num_cpus)
    try:
        yield
    finally:
        if started:  # a cluster this block joined belongs to whoever started it
            ray.shutdown()
