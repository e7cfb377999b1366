"""verl's actor keys with their effect: use_fused_kernels (the fused linear head or the full logits),
entropy_from_logits_with_chunking / chunk_size (the rows per entropy chunk), entropy checkpointing
(rlvr's entropy keeps only the logits), use_torch_compile (a compiled forward with the eager one's
values; a forward that does not compile falls back to eager with a warning)."""

from __future__ import annotations

import logging

import pytest
import torch
from model_worker_utils import make_config, prompt_batch

from rlvr.utils import torch_functional
from rlvr.workers.actor import dp_actor
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.models import build_causal_lm


def _actor(model_dir, *overrides, **kwargs) -> DataParallelPPOActor:
    cfg = make_config(model_dir, *overrides).actor_rollout_ref
    module = build_causal_lm(cfg.model, trainable=False)
    return DataParallelPPOActor(cfg.actor, module, None, mini_batch_size=4, log_prob_micro_batch_size=4,
                                world_size=1, device="cpu", **kwargs)


def _data():
    data = prompt_batch(temperature=1.0)
    data.batch["responses"] = data.batch["input_ids"][:, -3:]
    return data


def test_use_fused_kernels_picks_the_fused_head_or_the_full_logits(model_dir, monkeypatch):
    calls = []
    original = dp_actor.response_logits
    monkeypatch.setattr(dp_actor, "response_logits", lambda *a: calls.append(1) or original(*a))
    fused = _actor(model_dir)  # rlvr's default: on
    full = _actor(model_dir, "actor_rollout_ref.model.use_fused_kernels=false")
    assert fused.chunked_head and not full.chunked_head
    fused_lp, _ = fused.compute_log_prob(_data())
    assert calls == []
    full_lp, _ = full.compute_log_prob(_data())
    assert calls == [1] and torch.allclose(fused_lp, full_lp, atol=1e-5)
    own = _actor(model_dir, "actor_rollout_ref.model.use_fused_kernels=false",
                 "actor_rollout_ref.actor.use_fused_kernels=true")  # the actor's own key wins over the model's
    assert own.chunked_head


def test_entropy_chunk_size_sets_the_rows_per_chunk(model_dir, monkeypatch):
    chunks = []
    original = torch_functional._ChunkedEntropy.apply
    monkeypatch.setattr(torch_functional._ChunkedEntropy, "apply",
                        lambda logits, size: chunks.append(size) or original(logits, size))
    plain = _actor(model_dir, "actor_rollout_ref.model.use_fused_kernels=false")
    chunked = _actor(model_dir, "actor_rollout_ref.model.use_fused_kernels=false",
                     "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
                     "actor_rollout_ref.actor.entropy_from_logits_chunk_size=2")
    _, entropy = plain.compute_log_prob(_data(), calculate_entropy=True)
    default_chunks = set(chunks)
    chunks.clear()
    _, chunked_entropy = chunked.compute_log_prob(_data(), calculate_entropy=True)
    assert default_chunks == {torch_functional.DEFAULT_CHUNK_ROWS} and set(chunks) == {2}
    assert torch.allclose(entropy, chunked_entropy, atol=1e-6)


def test_the_entropy_keeps_only_the_logits_for_backward():
    """What verl's entropy_checkpointing buys (no [rows, vocab] probabilities kept for backward) is
    how rlvr's entropy always works: its autograd node keeps the logits, their logsumexp and the
    entropy, and recomputes the probabilities in backward."""
    logits = torch.randn(6, 50, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        entropy = torch_functional.entropy_from_logits(logits)
    assert sorted(saved) == [(6,), (6,), (6, 50)]
    entropy.sum().backward()
    probs = torch.softmax(logits.detach(), -1)
    expected = -probs * (torch.log(probs) + entropy.detach()[:, None])
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_a_forward_that_does_not_compile_runs_eagerly_with_a_warning(model_dir, monkeypatch, caplog):
    def broken(fn, **kwargs):
        def compiled(*args):
            raise RuntimeError("inductor: no C++ compiler")
        return compiled

    monkeypatch.setattr(torch, "compile", broken)
    eager, _ = _actor(model_dir).compute_log_prob(_data())
    actor = _actor(model_dir, compile_forward=True)
    with caplog.at_level(logging.WARNING, logger=dp_actor.__name__):
        log_probs, _ = actor.compute_log_prob(_data())
    assert torch.equal(log_probs, eager) and actor._compiled is None
    assert "torch.compile of the actor's forward failed (RuntimeError: inductor: no C++ compiler)" in caplog.text


@pytest.mark.slow
def test_the_compiled_forward_gives_the_eager_values(model_dir):
    """use_torch_compile: the micro-batch forward runs through torch.compile (inductor), the values
    those of the eager forward (slow: compiling takes a minute on a busy CPU)."""
    torch._dynamo.reset()
    eager, _ = _actor(model_dir).compute_log_prob(_data())
    actor = _actor(model_dir, compile_forward=True)
    compiled, _ = actor.compute_log_prob(_data())
    assert actor._compiled is not None and torch.allclose(compiled, eager, atol=1e-5)
