"""The config check of a launcher script (in-process): a name the process registered before calling
``main`` passes (the registries it imported hold it) and a misspelt one gets a suggestion that
includes it, without ``trainer.user_modules``; the check imports no registry that is not loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr.agent.env_agent import ENVIRONMENTS, register_environment
from rlvr.trainer.config.validate import registered_in_process
from rlvr.trainer.main_ppo import main


@pytest.fixture
def launcher_env():
    @register_environment("launcher_probe_env")
    class LauncherProbe:
        def reset(self, row):
            return None

        def step(self, text):
            return "", 0.0, True, {}

    yield "launcher_probe_env"
    ENVIRONMENTS.pop("launcher_probe_env")


def _args(tiny_data, env_name: str) -> list[str]:
    return ["--dry-run", "--preset", "grpo", f"data.train_files={tiny_data['train']}", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.agent.default_agent_loop=env_agent",
            f"actor_rollout_ref.rollout.multi_turn.env_name={env_name}"]


def test_a_name_registered_before_main_passes_the_check(launcher_env, tiny_data, capsys):
    assert registered_in_process()
    assert main(_args(tiny_data, launcher_env)) == 0
    assert main(_args(tiny_data, "launcher_probe_evn")) == 2
    err = capsys.readouterr().err
    assert "'launcher_probe_evn' is not valid (did you mean 'launcher_probe_env'?)" in err


def test_the_check_of_a_plain_process_imports_no_registry():
    """A process that registered nothing: the check is the built-in names' (no torch)."""
    code = ("import sys\nfrom rlvr.trainer.config.validate import registered_in_process\n"
            "assert not registered_in_process()\nprint(sorted(m for m in ('torch', 'rlvr.trainer.ppo.advantage', "
            "'rlvr.agent.env_agent') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
