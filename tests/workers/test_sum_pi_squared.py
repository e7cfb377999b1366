"""``sum_v pi(v)^2`` per response token (the optimal token baseline's input) from every forward path
of the actor: the chunked LM head and the full logits, padded and packed, and the Megatron
vocabulary-parallel head, each against a plain float64 softmax of the model's logits (1e-5)."""

from __future__ import annotations

import pytest
import torch
from packed_batches import make_actor, random_batch, tiny_model

from rlvr.protocol import DataProto
from rlvr.workers.megatron.vocab_parallel import vocab_parallel_token_stats

TEMPERATURE = 0.7


def _expected(model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Log-prob, entropy and sum of squared probabilities of each response token, from the full
    logits of the whole sequence in float64."""
    response_len = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    log_p = (logits[:, -response_len - 1 : -1].double() / TEMPERATURE).log_softmax(-1)
    mask = batch["response_mask"]
    return {"log_probs": log_p.gather(-1, batch["responses"][..., None]).squeeze(-1) * mask,
            "entropy": -(log_p.exp() * log_p).sum(-1) * mask, "sum_pi_squared": log_p.exp().square().sum(-1) * mask}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked_head", "logits_head"])
def test_every_forward_path_gives_the_softmax_statistics(packed, chunked):
    batch = random_batch(rows=6, seed=3)
    model = tiny_model("llama")
    expected = _expected(model, batch)
    actor = make_actor(model, packed=packed)
    assert actor.chunked_head and actor.share_prompts != packed  # padded: each prompt once, on its KV cache
    if not chunked:
        actor.chunked_head = actor.share_prompts = False  # the full logits, as on sharded ranks
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": TEMPERATURE})
    stats = actor.compute_log_prob_stats(data, calculate_entropy=True, calculate_sum_pi_squared=True)
    mask = batch["response_mask"].bool()
    for name, values in expected.items():
        assert stats[name].shape == values.shape
        assert (stats[name].double() - values)[mask].abs().max() < 1e-5, name
    assert set(actor.compute_log_prob_stats(data)) == {"log_probs"}  # only what is asked for
    log_probs, entropy = actor.compute_log_prob(data)
    assert torch.equal(log_probs, stats["log_probs"]) and entropy is None


def test_vocab_parallel_head_gives_the_sum_of_squared_probabilities():
    torch.manual_seed(2)
    logits = torch.randn(3, 4, 12) * 3
    padded = torch.cat([logits, torch.full((3, 4, 4), 50.0)], dim=-1)  # padding columns must not count
    labels = torch.randint(0, 12, (3, 4))
    stats = vocab_parallel_token_stats(padded, labels, 0, 12, temperature=TEMPERATURE, with_sum_pi_squared=True)
    probs = (logits.double() / TEMPERATURE).softmax(-1)
    assert (stats["sum_pi_squared"].double() - probs.square().sum(-1)).abs().max() < 1e-6
    assert set(stats) == {"log_probs", "sum_pi_squared"}
