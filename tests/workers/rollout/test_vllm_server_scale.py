"""Server replicas with tensor and data parallelism behind the router (``rollout.mode=async``), on
vLLM's real OpenAI server (``make test-vllm``): 2 managed replicas, each a server with
``--tensor-parallel-size 2`` (its 2 workers bound to their own cores, ``0|1``). Greedy generation
equals the HF engine's ids with fp32 log-probs, both replicas serve, and a weight sync reaches every
replica: all sampled tokens carry the new version and the new weights' log-probs."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]
pytest.importorskip("vllm")

from vllm_ranks import TEXTS, new_weights, prompts, tiny  # noqa: E402

from rlvr.trainer.config.schema import RolloutConfig  # noqa: E402
from rlvr.utils.testing import forward_log_probs  # noqa: E402
from rlvr.workers.rollout import HFRollout  # noqa: E402
from rlvr.workers.rollout.server import ServerRollout  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, tokenizer = tiny()
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.name, cfg.mode, cfg.response_length, cfg.prompt_length = "vllm", "async", 10, 32
    cfg.tensor_model_parallel_size = 2
    cfg.server.num_replicas, cfg.server.kv_cache_space_gb = 2, 1
    cfg.server.log_dir = str(tmp_path_factory.mktemp("server_logs"))
    engine = ServerRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=True)
    try:
        yield model, tokenizer, cfg, engine
    finally:
        engine.close()


def test_each_replica_runs_two_tensor_parallel_workers(setup):
    cfg, engine = setup[2], setup[3]
    for replica in engine.replicas:
        command = replica.command
        assert command[command.index("--tensor-parallel-size") + 1] == "2"
        assert len(replica.env["VLLM_CPU_OMP_THREADS_BIND"].split("|")) == 2
        log = replica.log_path.read_text(errors="replace")
        assert "local_rank=1" in log  # vLLM's thread-binding report lists both workers


def test_greedy_generation_equals_the_hf_engine_on_both_replicas(setup):
    model, tokenizer, cfg, engine = setup
    out = engine.generate_sequences(prompts(tokenizer, do_sample=False))
    reference = HFRollout(cfg, model, tokenizer, "cpu", seed=0, owns_module=False).generate_sequences(
        prompts(tokenizer, do_sample=False))
    for key in ("responses", "response_mask", "input_ids", "position_ids"):
        assert torch.equal(out.batch[key], reference.batch[key]), key
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], reference.batch["rollout_log_probs"][mask],
                               rtol=0, atol=TOL)
    assert all(served > 0 for served in engine.router.served), engine.router.served  # both replicas took requests


def test_a_sync_reaches_every_replica(setup):
    model, tokenizer, cfg, engine = setup
    moved = new_weights(model)
    engine.update_weights(moved.named_parameters(), 1)
    served = list(engine.router.served)
    out = engine.generate_sequences(prompts(tokenizer, temperature=0.8, n=1))
    assert all(after > before for after, before in zip(engine.router.served, served, strict=True))
    mask = out.batch["response_mask"].bool()
    assert len(out) == len(TEXTS) and (out.batch["response_versions"][mask] == 1).all()
    with torch.no_grad():
        fp32 = forward_log_probs(moved, out.batch, temperature=0.8)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], fp32[mask], rtol=0, atol=TOL)
