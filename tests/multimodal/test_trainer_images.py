"""The rlvr command trains the tiny Qwen2.5-VL on image questions end to end (local backend): the
processor comes from the model folder, validation and training see the images, and the report
shows the sample images with the answers."""

from __future__ import annotations

import json

from mm_helpers import write_image_rows

from rlvr.trainer.main_ppo import main
from rlvr.utils.model import load_causal_lm
from rlvr.utils.tokenizer import hf_processor

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    share = sum(ord(c) % 2 == 0 for c in solution_str) / max(len(solution_str), 1)
    return {"score": share, "acc": float(share > 0.5)}
'''


def test_grpo_on_image_questions_end_to_end(vl_dirs, tmp_path):
    train = write_image_rows(tmp_path / "train", count=8)
    val = write_image_rows(tmp_path / "val", count=4)
    (tmp_path / "reward.py").write_text(REWARD)
    run = tmp_path / "run"
    code = main(["--preset", "grpo",
                 f"actor_rollout_ref.model.path={vl_dirs['qwen2_5_vl']}", f"data.train_files={train}",
                 f"data.val_files={val}", "data.max_prompt_length=32", "data.max_response_length=6",
                 "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                 "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.use_rollout_log_probs=false",
                 f"custom_reward_function.path={tmp_path / 'reward.py'}",
                 "trainer.backend=local", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
                 "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
                 "trainer.val_before_train=true", f"trainer.default_local_dir={run}", "trainer.progress_bar=false",
                 "trainer.logger=[jsonl]", "trainer.num_threads=1", "trainer.log_val_generations=2",
                 "trainer.export_hf=true"])
    assert code == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/acc" in r] == [0, 2]
    trained = [r for r in rows if "actor/grad_norm" in r]
    assert len(trained) == 2 and all(r["actor/grad_norm"] > 0 for r in trained)
    assert all(r["training/rollout_log_probs_diff_max"] < 1e-5 for r in trained)  # the actor's own forward, with images
    report = (run / "report.md").read_text()
    assert '<img src="samples/step0_0_0.png" width="64">' in report
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step0_0_0.png", "step0_1_0.png", "step2_2_0.png",
                                                                  "step2_3_0.png"]
    exported = run / "hf_model"  # a vision-language folder: the model with its processor
    assert type(load_causal_lm(exported)).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(hf_processor(exported)).__name__ == "Qwen2_5_VLProcessorWithoutVideo"
