"""The config's way in for user code: ``trainer.user_modules`` (and verl's ``model.external_lib``)
imported before the config check, so the user's names pass and a typo still gets a suggestion;
object paths wherever a registry name goes; a scorer file that also registers extensions; user
scorers in the scoring processes; routes to a user's reward worker."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr import DataProto
from rlvr.agent.env_agent import ENVIRONMENTS
from rlvr.reward.managers import REWARD_MANAGER_REGISTRY
from rlvr.reward.routing import check_reward_routes, routed_worker_names
from rlvr.reward.scorers import SCORER_REGISTRY
from rlvr.reward.workers import REWARD_WORKER_REGISTRY
from rlvr.trainer.config import load_config
from rlvr.trainer.config.validate import registered_names, uses_user_code, validate_config
from rlvr.trainer.main_ppo import main
from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.utils import user_code
from rlvr.utils.errors import ConfigError
from rlvr.workers.reward_manager import ParallelRewardManager

REGISTRIES = (ENVIRONMENTS, ADV_ESTIMATOR_REGISTRY, REWARD_MANAGER_REGISTRY, SCORER_REGISTRY, REWARD_WORKER_REGISTRY)

EXTENSIONS = '''
"""One file of a user's extensions: an estimator, an environment, a scorer, a reward worker."""
import torch
from rlvr.agent import register_environment
from rlvr.reward.config import RewardWorkerConfig
from rlvr.reward.scorers import register_scorer
from rlvr.reward.workers import register_reward_worker
from rlvr.reward.workers.base import RuleRewardWorker
from rlvr.trainer.ppo.advantage import register_adv_est


@register_adv_est("my_est", needs_critic=True)
def my_est(token_level_rewards, response_mask, config=None, **kwargs):
    return token_level_rewards, token_level_rewards


def plain_est(token_level_rewards, response_mask, config=None, **kwargs):
    return token_level_rewards, token_level_rewards


@register_environment("my_env")
class MyEnv:
    def reset(self, row):
        return None

    def step(self, text):
        return "", 0.0, True, {}


@register_scorer("my_source")
def my_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 2.0 * len(solution_str)


@register_reward_worker("my_worker", RewardWorkerConfig)
class MyWorker(RuleRewardWorker):
    def score(self, responses, truths, data):
        raise NotImplementedError
'''


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """The file of extensions in a project folder (the working directory); afterwards its
    registrations, its module and the record of imported user code are gone."""
    monkeypatch.setattr(user_code, "_imported", {})
    monkeypatch.setattr(user_code, "_paths", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    project = tmp_path / "project"
    project.mkdir()
    path = project / "my_ext.py"
    path.write_text(textwrap.dedent(EXTENSIONS))
    monkeypatch.chdir(project)
    yield path
    for registry in REGISTRIES:
        for name in [name for name, entry in registry.items()
                     if registry._identity(entry).__module__.startswith(("my_ext", "rlvr_file_my_ext"))]:
            registry.pop(name)
    for name in [name for name in sys.modules if name.startswith(("my_ext", "rlvr_file_my_ext"))]:
        del sys.modules[name]


def _overrides(tiny_data, *extra):
    return [f"data.train_files={tiny_data['train']}", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", *extra]


def test_the_users_names_pass_the_check_after_the_import(extensions, tiny_data):
    cfg = load_config(None, _overrides(tiny_data, "trainer.user_modules=[my_ext]", "algorithm.adv_estimator=my_est",
                                         "actor_rollout_ref.rollout.agent.default_agent_loop=env_agent",
                                         "actor_rollout_ref.rollout.multi_turn.env_name=my_env"))
    assert cfg.critic.enable  # the user's estimator says it needs a critic; the import came first
    assert uses_user_code(cfg)
    validate_config(cfg)
    assert "my_env" in registered_names()["actor_rollout_ref.rollout.multi_turn.env_name"]


def test_the_command_checks_the_users_names_and_suggests_for_a_typo(extensions, tiny_data, capsys):
    base = ["--preset", "grpo", *_overrides(tiny_data, "trainer.user_modules=[my_ext]",
                                            "actor_rollout_ref.rollout.agent.default_agent_loop=env_agent")]
    assert main([*base, "actor_rollout_ref.rollout.multi_turn.env_name=my_env", "--dry-run"]) == 0
    assert main([*base, "actor_rollout_ref.rollout.multi_turn.env_name=my_evn", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "config error at 'actor_rollout_ref.rollout.multi_turn.env_name': 'my_evn' is not valid " \
           "(did you mean 'my_env'?); use one of my_env, retry" in err


def test_a_module_that_fails_to_import_is_a_config_error_at_its_key(extensions, tiny_data):
    Path("broken_ext.py").write_text("import not_installed_anywhere\n")
    with pytest.raises(ConfigError, match="'trainer.user_modules': importing 'broken_ext' failed: No module named "
                                          "'not_installed_anywhere'"):
        load_config("grpo", _overrides(tiny_data, "trainer.user_modules=[broken_ext]"))
    with pytest.raises(ConfigError, match="'critic.model.external_lib': importing 'nowhere_lib' failed"):
        load_config("grpo", _overrides(tiny_data, "critic.model.external_lib=nowhere_lib"))


def test_verls_external_lib_is_imported_and_files_become_absolute(extensions, tiny_data):
    cfg = load_config("grpo", _overrides(tiny_data, "actor_rollout_ref.model.external_lib=my_ext.py",
                                         "algorithm.adv_estimator=my_est"))
    assert cfg.actor_rollout_ref.model.external_lib == str(extensions)
    assert "my_est" in ADV_ESTIMATOR_REGISTRY and uses_user_code(cfg)
    assert user_code.current_user_code().modules == (str(extensions),)  # passed on to the workers


def test_object_paths_where_a_registry_name_goes(extensions, tiny_data):
    cfg = load_config(None, _overrides(tiny_data, "algorithm.adv_estimator=my_ext:plain_est"))
    assert not cfg.critic.enable and uses_user_code(cfg)
    validate_config(cfg)
    cfg = load_config(None, _overrides(tiny_data, "algorithm.adv_estimator=my_ext:my_est"))
    assert cfg.critic.enable  # the path of a registered estimator brings its entry's needs
    with pytest.raises(ConfigError, match="'algorithm.adv_estimator': cannot load the advantage estimator "
                                          "'my_ext:missing': 'my_ext' has no 'missing'"):
        validate_config(load_config("grpo", _overrides(tiny_data, "algorithm.adv_estimator=my_ext:missing")))


def test_a_scorer_file_that_also_registers_extensions_runs_once(extensions, monkeypatch):
    """The issue's case: ``custom_reward_function.path`` names the file of extensions that the user
    (or trainer.user_modules) imported already; it is reused, not run under another name, so its
    registrations do not collide."""
    monkeypatch.syspath_prepend(str(extensions.parent))  # a script in the project folder has it on its path
    import my_ext  # the user's own import

    config = OmegaConf.create({"reward_model": {"reward_manager": "naive"},
                               "custom_reward_function": {"path": str(extensions), "name": "compute_score"}})
    manager = load_reward_manager(config, None, 0)
    assert manager.compute_score(data_source="x", solution_str="abc", ground_truth=None) == 6.0
    assert ENVIRONMENTS["my_env"] is my_ext.MyEnv and sys.modules["my_ext"] is my_ext


def test_the_scoring_processes_import_the_users_scorers(extensions):
    """A scorer registered by a user module is found in the parallel manager's processes (started
    by forkserver: nothing inherited), because they import the user code of their parent first."""
    user_code.import_user_modules(["my_ext"])

    class Chars:
        def batch_decode(self, rows, skip_special_tokens=True):
            return ["".join(chr(int(i)) for i in row) for row in rows]

    responses = torch.tensor([[104, 105, 0], [104, 0, 0]])
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(2, 1, dtype=torch.long), "responses": responses,
                 "attention_mask": torch.cat([torch.ones(2, 1, dtype=torch.long), (responses > 0).long()], dim=1)},
        non_tensors={"data_source": np.array(["my_source", "my_source"], dtype=object),
                     "reward_model": np.array([{"ground_truth": ""}] * 2, dtype=object)})
    with ParallelRewardManager(Chars(), 0, num_workers=1, timeout_s=120.0) as manager:
        assert manager(data).sum(-1).tolist() == [2.0, 1.0]


def test_routes_to_a_users_reward_worker_by_name_or_object_path(extensions, tiny_data):
    user_code.import_user_modules(["my_ext"])
    routed = {"tiny": "my_ext:MyWorker"}
    cfg = load_config("grpo", _overrides(tiny_data, *[f"reward.routes.{k}={v}" for k, v in routed.items()]))
    check_reward_routes(cfg)
    assert routed_worker_names(cfg) == ["my_ext:MyWorker"] and uses_user_code(cfg)
    cfg.reward.routes.tiny = "my_ext:compute_score"  # a function: neither a worker nor a manager
    with pytest.raises(ConfigError, match=r"'reward.routes.tiny': 'my_ext:compute_score' is not a reward worker"):
        check_reward_routes(cfg)
