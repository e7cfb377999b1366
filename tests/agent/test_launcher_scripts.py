"""verl users' launcher scripts, run as a user runs them: the example project copied to a folder
outside the repository (never on ``PYTHONPATH``), with two scripts of its own, and its config not
listing the project in ``trainer.user_modules``:

- ``launch_main.py``: ``import guess_number`` (its import registers the environment, estimator, loss
  and reward manager), then rlvr's ``main()``;
- ``launch_run_ppo.py``: an environment, an advantage estimator and a policy loss defined in the
  script itself (``__main__``) and registered there, then ``load_config`` and ``run_ppo``.

Each trains one step on the local backend and on Ray, where the environment runs in the rollout
worker and the loss in the actor worker: the names reach them without ``trainer.user_modules``. The
config check accepts the names the launcher registered and still suggests for a misspelt one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlvr

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "user_project"

LAUNCH_MAIN = '''
"""Launch the guess-my-number job the verl way: import the project, then the trainer's main."""
import sys

import guess_number  # noqa: F401 - registers the project's environment, estimator, loss and reward manager
from rlvr.trainer.main_ppo import main

if __name__ == "__main__":
    sys.exit(main())
'''

LAUNCH_RUN_PPO = '''
"""Launch with an environment, an estimator and a policy loss of the script's own, registered here."""
import sys

import guess_number  # noqa: F401 - the estimator, reward manager and tool of the preset
from rlvr.agent import register_environment
from rlvr.trainer.config import load_config
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.core_algos import agg_loss, register_adv_est, register_policy_loss


@register_environment("script_countdown")
class Countdown:
    """Says "once more" until the model has answered twice; reports how many turns it saw."""

    def __init__(self, **env_kwargs):
        self.turns = 0

    def reset(self, row):
        return None

    def step(self, text):
        self.turns += 1
        return "Once more.", -0.25, self.turns >= 2, {"script_turns": float(self.turns)}


@register_adv_est("script_leave_one_out", needs_groups=True)
def script_leave_one_out(token_level_rewards, response_mask, index, **kwargs):
    """Each score minus the mean of the other samples of its prompt (every group has 2 here)."""
    scores = token_level_rewards.sum(-1)
    advantages = scores.clone()
    for i, uid in enumerate(index):
        others = [scores[j] for j, other in enumerate(index) if other == uid and j != i]
        advantages[i] = scores[i] - sum(others) / len(others)
    advantages = advantages[:, None] * response_mask
    return advantages, advantages


@register_policy_loss("script_reinforce")
def script_reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
    """Plain REINFORCE: -A * log pi."""
    loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode)
    zero = loss.detach() * 0
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": zero, "ppo_kl": (old_log_prob - log_prob).mean().detach(),
                  "pg_clipfrac_lower": zero}


if __name__ == "__main__":
    trainer = run_ppo(load_config("guess_number.yaml", sys.argv[1:]))
    print("trained steps:", trainer.global_steps)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The example project outside the repository, its data (8 rows) and the two launchers."""
    root = tmp_path_factory.mktemp("launcher_proj") / "guess_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__", "data", "runs"))
    assert REPO not in root.parents
    (root / "launch_main.py").write_text(textwrap.dedent(LAUNCH_MAIN))
    (root / "launch_run_ppo.py").write_text(textwrap.dedent(LAUNCH_RUN_PPO))
    subprocess.run([sys.executable, "make_data.py", "--train", "8", "--val", "4"], cwd=root, check=True, timeout=120)
    return root


def _env() -> dict[str, str]:
    """A user's shell: rlvr importable (this checkout's), the project folder not on any path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(rlvr.__file__).resolve().parents[1])
    return env


def _overrides(backend: str, model_dir: Path, run_dir: Path) -> list[str]:
    return ["--preset", "guess_number.yaml", "trainer.user_modules=[]", f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.backend={backend}", "trainer.total_training_steps=1", "trainer.val_before_train=false",
            "data.val_files=null", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
            "trainer.export_hf=false", "trainer.report=false", f"trainer.default_local_dir={run_dir}",
            "actor_rollout_ref.rollout.n=2", "data.max_prompt_length=256", "data.max_response_length=24",
            "trainer.call_timeout_s=600"]


def _run(project: Path, script: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=900)


def _step(run_dir: Path) -> dict:
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and np.isfinite(step["actor/pg_loss"])
    return step


BACKENDS = ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])]  # Ray: a minute each


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_import_then_main(backend, project, eos_prone_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = _run(project, "launch_main.py", _overrides(backend, eos_prone_model_dir, run_dir))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "group_median advantages, clipped_reinforce policy loss" in result.stdout
    step = _step(run_dir)
    assert step["reward/guess_number/count"] == 8  # the project's reward manager scored 4 prompts x 2 samples
    assert "agent/env/answered" in step  # the project's environment stepped in the rollout worker


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_script_registrations_then_run_ppo(backend, project, eos_prone_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = _overrides(backend, eos_prone_model_dir, run_dir)[2:] + [
        "actor_rollout_ref.rollout.multi_turn.env_name=script_countdown",
        "algorithm.adv_estimator=script_leave_one_out", "actor_rollout_ref.actor.policy_loss.loss_mode=script_reinforce"]
    result = _run(project, "launch_run_ppo.py", args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "trained steps: 1" in result.stdout  # with the script's estimator (the driver's own)
    step = _step(run_dir)
    assert step["agent/env/script_turns"] > 0  # the script's environment, sent by value, stepped
    assert step["actor/pg_clipfrac"] == 0.0  # the script's loss ran in the actor


@pytest.mark.slow
def test_the_check_takes_the_launchers_names_and_suggests_for_a_typo(project):
    base = ["--dry-run", "--preset", "guess_number.yaml", "trainer.user_modules=[]"]
    assert _run(project, "launch_main.py", base).returncode == 0
    result = _run(project, "launch_main.py", [*base, "actor_rollout_ref.rollout.multi_turn.env_name=guess_numbr"])
    assert result.returncode == 2
    assert ("config error at 'actor_rollout_ref.rollout.multi_turn.env_name': 'guess_numbr' is not valid "
            "(did you mean 'guess_number'?)") in result.stderr
