"""Ulysses sequence parallelism on 2 gloo ranks (FSDP2 over both, SP=2) equals one rank without it
(fp32, 1e-5): log-probs, entropies, values, losses, gradient norms and the weights after a step."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from packed_batches import actor_config, make_actor, make_critic, random_batch, tiny_model
from sp_ranks import ROWS, actor_step, critic_step, run_rank

from rlvr.utils.errors import ConfigError
from rlvr.workers.ulysses import check_attention_heads

TOL = 1e-5


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """What each of the 2 SP ranks computed (see ``sp_ranks.run_rank``)."""
    out = tmp_path_factory.mktemp("sp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, args=(port, str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


GLOBAL_ORDER = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])
"""The rows of the global mini-batches when each of 2 ranks holds half of 8 rows and takes 2 rows per
mini-batch: mini-batch 0 is rows 0, 1 of rank 0 and rows 4, 5 of rank 1. The one-rank reference runs
the batch in this order."""


def _reference_batch() -> dict:
    return {key: value[GLOBAL_ORDER] for key, value in random_batch(rows=ROWS, seed=7).items()}


def _both(ranks: list, *path: str) -> torch.Tensor:
    """A per-row result of the 2 ranks (each returns its own rows), in the reference's row order."""
    parts = []
    for result in ranks:
        for key in path:
            result = result[key]
        parts.append(result)
    return torch.cat(parts)[GLOBAL_ORDER]


def _assert_metrics(ranks: list, reference: dict, names: tuple[str, ...]) -> None:
    for name in names:
        for result in ranks:
            assert result[name] == pytest.approx(reference[name], rel=1e-5, abs=TOL), name


@pytest.mark.slow
def test_all_to_all_swaps_heads_and_tokens_and_back(two_ranks):
    zero, one = (r["round_trip"] for r in two_ranks)
    # rank r gets heads 2r, 2r+1 of every token: rank 0's 3 tokens then rank 1's
    torch.testing.assert_close(zero["full"], torch.cat([zero["x"][:, :2], one["x"][:, :2]], dim=2))
    torch.testing.assert_close(one["full"], torch.cat([zero["x"][:, 2:], one["x"][:, 2:]], dim=2))
    for result in (zero, one):
        torch.testing.assert_close(result["back"], result["x"])
        torch.testing.assert_close(result["grad"], torch.arange(24.0).view(1, 4, 3, 2))


def test_ranks_of_a_group_shuffle_their_shared_rows_alike(two_ranks):
    zero, one = (r["shuffle"] for r in two_ranks)
    assert torch.equal(zero, one) and sorted(zero.tolist()) == list(range(16))


@pytest.mark.parametrize(("arch", "kv_heads"), [("llama", 2), ("qwen2", 1)])
def test_sequence_parallel_actor_equals_one_rank(two_ranks, arch, kv_heads):
    batch = _reference_batch()
    config = actor_config("use_dynamic_bsz=true", "ppo_max_token_len_per_gpu=40")
    actor = make_actor(tiny_model(arch, num_key_value_heads=kv_heads), packed=True, lr=0.5,
                       mini_batch_size=ROWS // 2, config=config)
    reference = actor_step(actor, batch)
    mask = batch["response_mask"].bool()
    for key in ("log_probs", "entropy"):
        assert float((_both(two_ranks, arch, key) - reference[key])[mask].abs().max()) < TOL, key
    _assert_metrics([r[arch]["metrics"] for r in two_ranks], reference["metrics"],
                    ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"))
    for name, param in actor.module.named_parameters():
        for result in two_ranks:
            torch.testing.assert_close(result[arch]["weights"][name], param.detach(), atol=TOL, rtol=1e-5, msg=name)


def test_sequence_parallel_critic_equals_one_rank(two_ranks):
    batch = _reference_batch()
    critic = make_critic("llama", 1, True, 1, 0.5, ROWS // 2)
    reference = critic_step(critic, batch)
    mask = batch["response_mask"].bool()
    assert float((_both(two_ranks, "critic", "values") - reference["values"])[mask].abs().max()) < TOL
    _assert_metrics([r["critic"]["metrics"] for r in two_ranks], reference["metrics"],
                    ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"))
    for name, param in critic.module.named_parameters():
        for result in two_ranks:
            torch.testing.assert_close(result["critic"]["weights"][name], param.detach(), atol=TOL, rtol=1e-5)


def test_head_counts_must_split_over_the_group():
    check_attention_heads(4, 2, 2, "k")
    check_attention_heads(4, 1, 2, "k")  # one key/value head, repeated
    check_attention_heads(8, 2, 4, "k")
    with pytest.raises(ConfigError, match=r"'k': the model has 9 attention heads, which do not split over 2"):
        check_attention_heads(9, 3, 2, "k")
    with pytest.raises(ConfigError, match="6 key/value heads: a sequence-parallel size must divide them or be a "
                                          "multiple of them, 4 is neither"):
        check_attention_heads(12, 6, 4, "k")
