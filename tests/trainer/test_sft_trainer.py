"""``python -m rlvr.trainer.sft_trainer``: steps equal a plain PyTorch loop (loss and weights; packed and
padded), a resumed run continues exactly, 2 ranks (worker processes, and torchrun) train as one, the
output merges and loads as a model path, bad data exits with the file and row."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sft_helpers import write_conversations
from transformers import AutoModelForCausalLM

from rlvr.model_merger import main as merge_main
from rlvr.single_controller.base.worker import free_port
from rlvr.trainer.config.sft_check import load_sft_config
from rlvr.trainer.data.sft_dataset import MultiTurnSFTDataset, collate_sft_batch
from rlvr.trainer.sft_trainer import main, run_sft
from rlvr.utils.testing import save_tiny_model, tiny_tokenizer

STEPS, BATCH, LR = 3, 4, 0.01


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft")
    return {"model": save_tiny_model(root / "model"), "train": write_conversations(root / "train.parquet", 12, 0),
            "val": write_conversations(root / "val.jsonl", 6, 1)}


def overrides(files, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.path={files['model']}", f"data.train_files={files['train']}", f"data.val_files={files['val']}",
            f"data.train_batch_size={BATCH}", "data.micro_batch_size_per_gpu=2", "data.use_dynamic_bsz=false",
            "data.max_length=256", f"optim.lr={LR}", f"trainer.total_training_steps={STEPS}", "trainer.device=cpu",
            f"trainer.default_local_dir={run_dir}", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
            "trainer.num_threads=1", "trainer.call_timeout_s=300", *extra]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / f"global_step_{step}" / "actor" / "model.pt")


def reference_loop(files, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same run as a plain loop: batches in the trainer's seeded order (seed 1, epoch 0), the NLL
    of the marked tokens averaged over all of them, clipped to norm 1, torch's AdamW."""
    tokenizer = tiny_tokenizer()
    config = load_sft_config([f"data.max_length=256"]).data
    dataset = MultiTurnSFTDataset(str(files["train"]), tokenizer, config)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
    model = AutoModelForCausalLM.from_pretrained(files["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for step in range(steps):
        batch = collate_sft_batch([dataset[i] for i in order[step * BATCH:(step + 1) * BATCH]], tokenizer.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["responses"], reduction="none")
        mask = batch["response_mask"].float()
        loss = (nll * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


@pytest.mark.parametrize("packed", [False, True])
def test_steps_equal_a_plain_loop(files, tmp_path, packed):
    """Padded micro-batches of 2 rows, or (verl's defaults) packed micro-batches of at most 150 tokens."""
    layout = ["model.use_remove_padding=true", "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=150"] \
        if packed else ["model.use_remove_padding=false"]
    run_sft(load_sft_config(overrides(files, tmp_path, *layout)))
    rows = metrics(tmp_path)
    losses, weights = reference_loop(files)
    assert [row["step"] for row in rows] == [1, 2, 3] and rows[0]["train/lr"] == LR
    assert [row["train/loss"] for row in rows] == pytest.approx(losses, abs=1e-5)
    trained = final_weights(tmp_path)
    assert max(float((trained[k] - weights[k]).abs().max()) for k in weights) < 2e-5
    assert rows[-1]["val/loss"] < rows[0]["train/loss"]
    # the exported folder is the last checkpoint's model and loads as a model path
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model").state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)


def test_resume_continues_exactly_and_checkpoints_merge(files, tmp_path):
    run_sft(load_sft_config(overrides(files, tmp_path / "straight", "trainer.save_freq=1")))
    run_sft(load_sft_config(overrides(files, tmp_path / "halted", "trainer.total_training_steps=2",
                                      "checkpoint.save_contents=[model,optimizer,extra,hf_model]")))
    run_sft(load_sft_config(overrides(files, tmp_path / "halted")))
    assert [r["train/loss"] for r in metrics(tmp_path / "halted")] == [r["train/loss"] for r in metrics(tmp_path / "straight")]
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "halted")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    copy = AutoModelForCausalLM.from_pretrained(tmp_path / "halted" / "global_step_2" / "actor" / "huggingface")
    assert all(torch.equal(copy.state_dict()[k], v) for k, v in final_weights(tmp_path / "straight", 2).items())
    assert merge_main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path / "halted" / f"global_step_{STEPS}"),
                       "--target_dir", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    assert all(torch.equal(merged[k], resumed[k]) for k in resumed)


@pytest.mark.slow
def test_two_worker_processes_train_as_one_rank(files, tmp_path):
    run_sft(load_sft_config(overrides(files, tmp_path / "one")))
    run_sft(load_sft_config(overrides(files, tmp_path / "two", "trainer.n_gpus_per_node=2")))
    assert [r["train/loss"] for r in metrics(tmp_path / "two")] == pytest.approx(
        [r["train/loss"] for r in metrics(tmp_path / "one")], abs=1e-6)
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-6


@pytest.mark.slow  # torchrun and two fresh interpreters: 40 s on 2 shared cores
def test_torchrun_ranks_train_as_one_rank(files, tmp_path):
    run_sft(load_sft_config(overrides(files, tmp_path / "one")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                "-m", "rlvr.trainer.sft_trainer", *overrides(files, tmp_path / "spmd")]
    done = subprocess.run(torchrun, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["train/loss"] for r in metrics(tmp_path / "spmd")] == pytest.approx(
        [r["train/loss"] for r in metrics(tmp_path / "one")], abs=1e-6)
    one, spmd = final_weights(tmp_path / "one"), final_weights(tmp_path / "spmd")
    assert max(float((one[k] - spmd[k]).abs().max()) for k in one) < 1e-6
    assert (tmp_path / "spmd" / "hf_model" / "config.json").is_file()


def test_bad_data_exits_2_naming_file_row_and_field(files, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n'
                   '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}\n')
    assert main(overrides(files, tmp_path / "run", f"data.train_files={bad}")) == 2
    assert f"{bad}, line 2 field messages[1].content must be a string" in capsys.readouterr().err


def test_sft_output_trains_a_grpo_step_as_the_actor(files, tiny_data, tmp_path):
    from trainer_helpers import tiny_config

    from rlvr.trainer.main_ppo import run_ppo

    run_sft(load_sft_config(overrides(files, tmp_path / "sft")))
    cfg = tiny_config(tmp_path / "sft" / "hf_model", tiny_data, tmp_path / "grpo", preset="grpo",
                      **{"trainer.total_training_steps": 1, "trainer.val_before_train": False})
    trainer = run_ppo(cfg)
    (step,) = [row for row in trainer.metrics_history if "actor/pg_loss" in row]
    assert step["step"] == 1 and all(map(math.isfinite, (step["actor/pg_loss"], step["actor/grad_norm"])))


def test_lora_sft_trains_the_adapters_and_exports_them_merged(files, tmp_path):
    run_sft(load_sft_config(overrides(files, tmp_path, "model.lora_rank=4", "model.lora_alpha=8", "optim.lr=0.05")))
    base = AutoModelForCausalLM.from_pretrained(files["model"]).state_dict()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model").state_dict()
    changed = {k for k in base if not torch.equal(base[k], exported[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)  # only the LoRA targets moved
    losses = [row["train/loss"] for row in metrics(tmp_path)]
    assert losses[-1] < losses[0]
