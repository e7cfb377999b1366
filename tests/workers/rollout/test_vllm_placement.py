"""In-process vLLM engines on every rollout worker (rlvr.workers.rollout.placement): 2 gloo ranks with
an engine each (data parallel) and with one engine between them (tensor parallel 2 on vLLM's
external launcher). Each rank gets its part of the batch; the parts put together give the HF engine's
greedy rows, sampled log-probs equal an fp32 forward (1e-4), and after an in-place weight sync every
engine samples with the new weights and reports the new version. Needs vLLM (``make test-vllm``)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlvr.protocol import DataProto

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from vllm_ranks import TEXTS, run_rank  # noqa: E402

TOL = 1e-4
RANKS = 2


@pytest.fixture(scope="module", params=[1, 2], ids=["dp2", "tp2"])
def ranks(request, tmp_path_factory) -> tuple[int, list[dict]]:
    tp, out = request.param, tmp_path_factory.mktemp(f"vllm_tp{request.param}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, args=(RANKS, tp, port, str(out)), nprocs=RANKS, start_method="spawn")
    return tp, [torch.load(out / f"rank{rank}.pt") for rank in range(RANKS)]


def _joined(results: list[dict], phase: str, call: str) -> dict[str, torch.Tensor]:
    """The ranks' rows of one call, in rank order (the whole batch)."""
    return {key: torch.cat([r[phase][call]["batch"][key] for r in results]) for key in results[0][phase][call]["batch"]}


def test_engines_follow_the_placement(ranks):
    tp, results = ranks
    assert [r["engine"] for r in results] == ([0, 1] if tp == 1 else [0, 0])
    # TP on CPU: vLLM's shared-memory names carry the group's port and are gone once the engine is up
    # (a name left behind made the next run's engine fail with errno 17)
    assert [r["shm_left"] for r in results] == [[], []]


@pytest.mark.parametrize("phase", ["before", "after"])
def test_the_ranks_parts_make_the_hf_engines_greedy_batch(ranks, phase):
    _, results = ranks
    got, expected = _joined(results, phase, "greedy"), results[0][f"hf_{phase}"]
    assert got["responses"].shape[0] == len(TEXTS)
    for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(got[key], expected[key]), key
    mask = got["response_mask"].bool()
    assert float((got["rollout_log_probs"] - expected["rollout_log_probs"])[mask].abs().max()) < TOL


@pytest.mark.parametrize("phase", ["before", "after"])
def test_sampled_log_probs_equal_a_forward_of_the_current_weights(ranks, phase):
    _, results = ranks
    version = 0 if phase == "before" else 1
    for result in results:
        sampled = result[phase]["sampled"]
        mask = sampled["batch"]["response_mask"].bool()
        assert mask.any()
        assert float((sampled["forward"] - sampled["batch"]["rollout_log_probs"])[mask].abs().max()) < TOL
        assert sampled["meta"]["rollout_weights_version"] == version  # every engine took the sync
        assert sampled["batch"]["response_versions"][mask].eq(version).all()


def test_ranks_of_one_engine_sample_the_same_rows_and_engines_differ(ranks):
    """TP: both ranks ran the same requests (each kept its half); DP: two engines, two seeds."""
    tp, results = ranks
    halves = [r["before"]["sampled"]["batch"]["responses"] for r in results]
    assert halves[0].shape == halves[1].shape == (len(TEXTS) // RANKS, 10)
    if tp == 1:
        assert results[0]["engine"] != results[1]["engine"]
    gathered = DataProto.from_dict(tensors=_joined(results, "before", "sampled"))
    assert len(gathered) == len(TEXTS)
