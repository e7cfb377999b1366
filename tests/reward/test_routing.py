"""The run's reward routing (rlvr.reward.routing): config and data checks, the reward worker groups on
the local backend, and the router over groups and managers."""

from __future__ import annotations

import json

import pytest
import torch
from reward_batch import make_batch

from rlvr.reward.config import MathRuleRewardConfig
from rlvr.reward.routing import (
    RewardWorkerGroups,
    build_reward_router,
    check_data_routes,
    check_reward_functions,
    check_reward_routes,
    file_domains,
    reward_worker_config,
    routed_worker_names,
)
from rlvr.trainer.config import RlvrConfig, load_config
from rlvr.trainer.config.validate import check_field_choices
from rlvr.trainer.data import write_rows
from rlvr.utils.errors import ConfigError
from rlvr.utils.testing import tiny_tokenizer

IFEVAL_NO_COMMA = json.dumps({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]})


def _cfg(*overrides: str):
    return load_config(None, ["trainer.backend=local", *overrides])


def test_route_names_are_checked_against_both_registries():
    cfg = _cfg("reward.routes.math=math_rule", "reward.routes.gsm8k=naive", "reward.routes.ifeval=ifeval")
    check_reward_routes(cfg)
    assert routed_worker_names(cfg) == ["ifeval", "math_rule"]
    with pytest.raises(ConfigError, match=r"reward.routes.code.*'sandbox' is neither a reward worker "
                                          r"\(code_sandbox, crossthinkqa.*\), a reward manager \(batch, dapo.*\) nor 'reward_model'"):
        check_reward_routes(_cfg("reward.routes.code=sandbox"))
    with pytest.raises(ConfigError, match="reward.num_workers.*local backend runs the reward workers in the driver"):
        check_reward_routes(_cfg("reward.routes.math=math_rule", "reward.num_workers=2"))
    with pytest.raises(ConfigError, match="reward.num_workers.*must be >= 1"):
        check_reward_routes(_cfg("trainer.backend=ray", "reward.routes.math=math_rule", "reward.num_workers=0"))
    with pytest.raises(ConfigError, match="reward.route_key.*use one of data_source, tag"):
        check_field_choices(_cfg("reward.route_key=ability"), RlvrConfig)


def test_every_domain_of_the_data_files_needs_a_route(tmp_path):
    rows = [{"data_source": source, "tag": tag, "reward_model": {"ground_truth": "1"}, "prompt": []}
            for source, tag in [("math", "arith"), ("code", "prog"), ("math", "arith")]]
    train = tmp_path / "train.jsonl"
    write_rows(rows, train)
    write_rows([{"data_source": "chess", "reward_model": {}, "prompt": []}], tmp_path / "val.jsonl")
    assert file_domains(str(train), "data_source", "training data") == {"math", "code"}
    assert file_domains([str(train)], "tag", "training data") == {"arith", "prog"}
    assert file_domains(str(tmp_path / "val.jsonl"), "tag", "validation data") == {"chess"}  # no tag: the source
    with pytest.raises(ConfigError, match=r"the training data has data_source value\(s\) 'code' with no reward route "
                                          r"\(routes exist for: math\)"):
        check_reward_routes(_cfg(f"data.train_files={train}", "reward.routes.math=math_rule"))
    both = _cfg(f"data.train_files={train}", f"data.val_files={tmp_path / 'val.jsonl'}",
                "reward.routes.math=math_rule", "reward.routes.code=code_sandbox")
    with pytest.raises(ConfigError, match=r"the validation data has data_source value\(s\) 'chess'"):
        check_reward_routes(both)
    with pytest.raises(ConfigError, match="has no column 'ability'"):
        file_domains(str(train), "ability", "training data")


def test_dataset_objects_given_to_the_trainer_are_checked_too():
    cfg = _cfg("reward.routes.math=math_rule")
    check_data_routes(cfg, [{"data_source": "math"}], None)
    with pytest.raises(ConfigError, match=r"validation data has data_source value\(s\) 'code'"):
        check_data_routes(cfg, [{"data_source": "math"}], [{"data_source": "code"}])
    with pytest.raises(ConfigError, match=r"training data items have no field 'tag'"):
        check_data_routes(_cfg("reward.routes.math=math_rule", "reward.route_key=tag"), [{"data_source": "math"}], None)


def test_trainer_takes_reward_functions_or_routes_not_both():
    assert check_reward_functions(_cfg("reward.routes.math=math_rule"), None, None) is True
    assert check_reward_functions(_cfg(), object(), None) is False
    with pytest.raises(ConfigError, match="reward.routes.*pass reward_fn=None"):
        check_reward_functions(_cfg("reward.routes.math=math_rule"), object(), None)
    with pytest.raises(ConfigError, match="needs a reward_fn.*or route domains to reward workers"):
        check_reward_functions(_cfg(), None, None)


def test_worker_config_comes_from_its_section_and_the_policy_tokenizer():
    cfg = _cfg("actor_rollout_ref.model.path=/models/policy", "reward.workers.math_rule.timeout_s=2.5")
    config = reward_worker_config(cfg, "math_rule")
    assert config == MathRuleRewardConfig(tokenizer_path="/models/policy", timeout_s=2.5)
    cfg = _cfg("actor_rollout_ref.model.tokenizer_path=/tok", "reward.workers.code_sandbox.sandbox.wall_timeout_s=3")
    sandbox = reward_worker_config(cfg, "code_sandbox")
    assert sandbox.tokenizer_path == "/tok" and sandbox.sandbox.wall_timeout_s == 3.0
    assert reward_worker_config(_cfg("reward.workers.ifeval.tokenizer_path=/own"), "ifeval").tokenizer_path == "/own"


def test_local_reward_worker_groups_score_a_mixed_batch(tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    cfg = _cfg(f"actor_rollout_ref.model.path={tmp_path / 'tok'}", "reward.routes.math=math_rule",
               "reward.routes.ifeval=ifeval", "reward.routes.openai/gsm8k=naive")
    workers = RewardWorkerGroups(cfg, "local")
    try:
        assert sorted(workers.groups) == ["ifeval", "math_rule"]
        router = build_reward_router(cfg, tok, workers.groups, num_examine=0)
        data = make_batch(tok, [r"\boxed{4}", "a, b", "#### 7", r"\boxed{5}", "no commas here", "#### 8"],
                          ["math", "ifeval", "openai/gsm8k"] * 2, ["4", IFEVAL_NO_COMMA, "7", "4", IFEVAL_NO_COMMA, "7"],
                          response_len=16)
        out = router(data, return_dict=True)
    finally:
        workers.shutdown()
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    last = data.batch["response_mask"].sum(-1) - 1
    assert torch.equal(out["reward_tensor"].nonzero()[:, 1], last[[0, 2, 4]])  # on each row's last valid token
    metrics = out["reward_metrics"]
    assert metrics["reward/math/count"] == 2.0 and metrics["reward/math/mean_score"] == 0.5
    assert metrics["reward/math/correct"] == 0.5  # the math worker's own metric, per sample, averaged
    assert metrics["reward/ifeval/count"] == 2.0 and metrics["reward/ifeval/mean_score"] == 0.5
    assert metrics["reward/openai/gsm8k/count"] == 2.0 and metrics["reward/openai/gsm8k/mean_score"] == 0.5


def test_help_config_documents_the_reward_section():
    from rlvr.trainer.config import help_config

    text = help_config()
    assert "[reward] reward routing: each domain scored by its reward worker group or manager" in text
    assert "  reward.routes = {}\n      domain -> reward worker (math_rule | code_sandbox" in text
    assert "  reward.workers.code_sandbox.sandbox.wall_timeout_s = 10.0" in text
    assert "  reward.workers.ifeval.reward_mode = 'fraction'" in text


def test_a_reward_worker_that_cannot_start_leaves_nothing_behind(tmp_path, monkeypatch):
    from rlvr.reward.workers.math_rule import MathRuleRewardWorker
    from rlvr.single_controller import Dispatch, register
    from rlvr.utils.errors import WorkerError

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    removed = []
    monkeypatch.setattr("rlvr.single_controller.local.LocalResourcePool.remove", lambda pool: removed.append(pool))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def broken(self, pipeline_config=None):
        raise RuntimeError("judge endpoint unreachable")

    monkeypatch.setattr(MathRuleRewardWorker, "initialize", broken)
    cfg = _cfg(f"actor_rollout_ref.model.path={tmp_path / 'tok'}", "reward.routes.math=math_rule")
    with pytest.raises(WorkerError, match="judge endpoint unreachable"):
        RewardWorkerGroups(cfg, "local")
    assert len(removed) == 1
