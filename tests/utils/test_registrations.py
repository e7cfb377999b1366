"""rlvr.utils.registrations: the names a process registered of its own (a module it imported, code of
its ``__main__``) reach a worker process with their metadata, without ``trainer.user_modules``;
rlvr's own names are not sent; what cannot be sent or loaded is named."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from rlvr.agent.env_agent import ENVIRONMENTS
from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY
from rlvr.trainer.ppo.policy_loss import POLICY_LOSS_REGISTRY
from rlvr.utils import user_code
from rlvr.utils.registrations import user_code_for_workers, user_registrations
from rlvr.utils.registry import RegistryKeyError, all_registries
from rlvr.utils.user_code import MAX_ENV_REGISTRATIONS, UserCode, UserCodeError, import_user_code

LAUNCHER_MODULE = """
from rlvr.agent import register_environment
from rlvr.trainer.ppo.advantage import register_adv_est


@register_environment("reg_probe_env")
class ProbeEnv:
    def reset(self, row):
        return "probe"

    def step(self, text):
        return "", 1.0, True, {}


@register_adv_est("reg_probe_est", needs_groups=True, reads_old_log_prob=True)
def probe_estimator(token_level_rewards, response_mask, **kwargs):
    return token_level_rewards, token_level_rewards
"""

WORKER = """
import sys
from rlvr.agent import ENVIRONMENTS
from rlvr.single_controller.base.worker import Worker
from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_needs
Worker()  # what every worker process does first
env = ENVIRONMENTS["reg_probe_env"]()
print(type(env).__module__, env.reset({}), ENVIRONMENTS["reg_main_env"]().step("x")[1])
needs = get_adv_estimator_needs("reg_probe_est")
print(needs.needs_groups, needs.reads_old_log_prob, needs.needs_critic)
try:
    ENVIRONMENTS["reg_lost_env"]
except KeyError as err:
    print("MISS", err)
"""


@pytest.fixture
def registrations(tmp_path, monkeypatch):
    """A launcher's situation: the module ``reg_probe`` imported from the project folder (not
    through user_modules), a class of ``__main__`` and one whose module a worker cannot import,
    registered; all removed afterwards."""
    monkeypatch.setattr(user_code, "_imported", {})
    monkeypatch.setattr(user_code, "_paths", {})
    project = tmp_path / "proj"
    project.mkdir()
    (project / "reg_probe.py").write_text(textwrap.dedent(LAUNCHER_MODULE))
    monkeypatch.syspath_prepend(str(project))
    import reg_probe  # noqa: F401 - registers

    main_env = type("MainEnv", (), {"reset": lambda self, row: None, "step": lambda self, text: ("", 7.0, True, {})})
    main_env.__module__ = "__main__"  # defined in the launcher script: sent by value
    ENVIRONMENTS.add("reg_main_env", main_env)
    lost_module = types.ModuleType("reg_lost")  # exists only in this process
    lost_env = type("LostEnv", (), {})
    lost_env.__module__ = "reg_lost"
    lost_module.LostEnv = lost_env
    monkeypatch.setitem(sys.modules, "reg_lost", lost_module)
    ENVIRONMENTS.add("reg_lost_env", lost_env)
    yield project
    for name in ("reg_probe_env", "reg_main_env", "reg_lost_env"):
        ENVIRONMENTS.pop(name, None)
    ADV_ESTIMATOR_REGISTRY.pop("reg_probe_est", None)
    sys.modules.pop("reg_probe", None)


def test_only_the_users_names_are_sent_with_their_metadata_and_folders(registrations):
    entries, folders = user_registrations()
    sent = {(module, attribute, name): metadata for module, attribute, name, _, metadata in entries}
    assert ("rlvr.agent.env_agent", "ENVIRONMENTS", "reg_probe_env") in sent
    assert ("rlvr.agent.env_agent", "ENVIRONMENTS", "reg_main_env") in sent
    assert sent[("rlvr.trainer.ppo.advantage", "ADV_ESTIMATOR_REGISTRY", "reg_probe_est")] == {
        "needs_critic": False, "needs_groups": True, "needs_greedy_baseline": False, "reads_old_log_prob": True,
        "needs_sum_pi_squared": False}
    assert not any(name in ("retry", "grpo", "vanilla") for _, _, name, _, _ in entries)  # rlvr's own stay
    assert str(registrations) in folders  # where reg_probe was imported from


def test_a_worker_process_gets_them_without_user_modules(registrations, tmp_path):
    """A fresh interpreter elsewhere, without the project on its path: ``Worker()`` imports
    ``reg_probe`` by reference (it registers itself again), rebuilds ``__main__``'s class from its
    code, keeps the estimator's needs, and says why the unloadable one is missing."""
    code = user_code_for_workers()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(code.to_env())
    env["PYTHONPATH"] = os.pathsep.join([str(Path(user_code.__file__).resolve().parents[2]), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, "-c", WORKER], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "reg_probe probe 7.0"
    assert lines[1] == "True True False"
    assert lines[2].startswith("MISS") and "The driver registered 'reg_lost_env', but this process could not load " \
                                           "it: ModuleNotFoundError" in lines[2] and "trainer.user_modules" in lines[2]


def test_registering_again_in_the_same_process_changes_nothing(registrations):
    before = dict(ENVIRONMENTS)
    import_user_code(UserCode(registrations=user_code_for_workers().registrations))
    assert dict(ENVIRONMENTS) == before


def test_an_entry_that_cannot_be_pickled_is_left_out_with_a_warning(registrations, caplog):
    class Unpicklable:
        def __reduce__(self):
            raise TypeError("no pickling here")

        def __call__(self, **kwargs):
            return None

    ENVIRONMENTS.add("reg_unpicklable", Unpicklable())
    try:
        entries, _ = user_registrations()
    finally:
        ENVIRONMENTS.pop("reg_unpicklable")
    assert "reg_unpicklable" not in {name for _, _, name, _, _ in entries}
    assert "the environment 'reg_unpicklable'" in caplog.text and "no pickling here" in caplog.text


def test_too_much_for_an_environment_variable_is_refused():
    with pytest.raises(UserCodeError, match="list it in trainer.user_modules"):
        UserCode(registrations=pickle.dumps(b"x" * MAX_ENV_REGISTRATIONS)).to_env()


def test_every_registry_is_known():
    known = [id(registry) for registry in all_registries()]
    assert all(id(registry) in known for registry in (ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, ENVIRONMENTS))
    with pytest.raises(RegistryKeyError, match="Unknown environment: nothing_here; valid names:"):
        ENVIRONMENTS["nothing_here"]
