"""``--backend megatron`` on checkpoints of the Megatron workers (megatron-core; the local backend
starts the model-parallel ranks over gloo): the merged model holds exactly the weights the workers
gather for their own export, for every tensor x pipeline split."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from merger_helpers import ppo_step
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

sys.path.insert(0, str(Path(__file__).parents[1] / "workers"))
from model_worker_utils import local_group, make_config  # noqa: E402

from rlvr.model_merger import main  # noqa: E402
from rlvr.utils.testing import save_tiny_model  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_ranks():
    yield
    gc.collect()
    shutdown_local_ranks()


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_megatron_checkpoint_merges_to_the_gathered_weights(tmp_path, tp, pp):
    model_dir = str(save_tiny_model(tmp_path / "model", seed=0))
    config = make_config(model_dir, "actor_rollout_ref.model.attn_implementation=eager",
                         "actor_rollout_ref.actor.optim.lr=0.001", "actor_rollout_ref.actor.strategy=megatron",
                         f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
                         f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}")
    group = local_group(MegatronActorRolloutRefWorker, config, "actor")
    ppo_step(group)
    group.save_checkpoint(str(tmp_path / "actor"))
    gathered = group.get_actor_weights()[0]
    assert main(["merge", "--backend", "megatron", "--tie-word-embedding", "--local_dir", str(tmp_path / "actor"),
                 "--target_dir", str(tmp_path / "out")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert merged.keys() == gathered.keys()
    assert all(torch.equal(merged[k], gathered[k]) for k in gathered)
    original = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert any(not torch.equal(merged[k], original[k]) for k in original)  # the step changed the weights
