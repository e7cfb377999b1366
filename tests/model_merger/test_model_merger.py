"""``python -m rlvr.model_merger``: checkpoints of the FSDP2 workers (1 and 2 ranks, tied and untied
embeddings, LoRA merged and as an adapter, a critic, a vision-language model) merge into Hugging Face
folders whose logits equal the model's in training; Megatron shards join exactly (pure torch); a
missing, truncated or altered checkpoint exits non-zero naming the path and the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from merger_helpers import actor_logits, model_logits, ppo_step, token_batch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parents[1] / "workers"))
from model_worker_utils import local_group, make_config  # noqa: E402

from rlvr.model_merger import main  # noqa: E402
from rlvr.single_controller import ClassWithInitArgs  # noqa: E402
from rlvr.single_controller.process import ProcessResourcePool, ProcessWorkerGroup  # noqa: E402
from rlvr.trainer.checkpoint import CheckpointManager  # noqa: E402
from rlvr.utils.testing import save_tiny_model, tiny_tokenizer  # noqa: E402
from rlvr.utils.tokenizer import hf_processor  # noqa: E402
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402
from rlvr.workers.megatron.hf_mapping import LlamaShape, stage_rules, shard_state  # noqa: E402


def merge(local_dir: Path, target: Path, *extra: str, backend: str = "fsdp") -> int:
    return main(["merge", "--backend", backend, "--local_dir", str(local_dir), "--target_dir", str(target), *extra])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory) -> str:
    """A tiny Llama whose LM head is a weight of its own."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("untied") / "model"
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("tied", [True, False])
def test_one_rank_checkpoint_merges_to_the_same_logits(model_dir, untied_model_dir, tmp_path, tied):
    group = local_group(ActorRolloutRefWorker, make_config(model_dir if tied else untied_model_dir), "actor")
    ppo_step(group)
    group.save_checkpoint(str(tmp_path / "actor"))
    assert merge(tmp_path / "actor", tmp_path / "out") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    data = token_batch(seed=5)
    in_training = actor_logits(group._workers[0], data).batch["logits"]
    assert torch.equal(model_logits(merged, data), in_training)
    shared = merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    assert shared is tied and merged.config.tie_word_embeddings is tied
    assert tiny_tokenizer()("a b").input_ids == type(tiny_tokenizer()).from_pretrained(tmp_path / "out")("a b").input_ids
    # the merged folder starts a run: it is what actor_rollout_ref.model.path loads
    again = local_group(ActorRolloutRefWorker, make_config(str(tmp_path / "out")), "actor")
    assert torch.equal(actor_logits(again._workers[0], data).batch["logits"], in_training)


@pytest.mark.slow
def test_two_rank_checkpoint_merges_to_the_same_logits(model_dir, tmp_path):
    """FSDP2 over 2 gloo ranks (worker processes): the merged model computes each rank's logits exactly."""
    pool = ProcessResourcePool([2], use_gpu=False)
    group = ProcessWorkerGroup(pool, ClassWithInitArgs(ActorRolloutRefWorker, make_config(model_dir), "actor"),
                               call_timeout_s=300, device_name="cpu")
    try:
        group.init_model()
        ppo_step(group)
        group.save_checkpoint(str(tmp_path / "actor"))
        data = token_batch(seed=5)
        in_training = group.execute_with_func_generator(actor_logits, data).batch["logits"]
    finally:
        group.shutdown()
    assert merge(tmp_path / "actor", tmp_path / "out") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(model_logits(merged, data, chunks=2), in_training)


def test_lora_checkpoint_merged_and_as_an_adapter(model_dir, tmp_path):
    from peft import PeftModel

    config = make_config(model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                         "actor_rollout_ref.actor.optim.lr=0.05")
    group = local_group(ActorRolloutRefWorker, config, "actor")
    ppo_step(group)
    group.save_checkpoint(str(tmp_path / "actor"))
    meta = json.loads((tmp_path / "actor" / "lora_train_meta.json").read_text())
    assert (meta["r"], meta["lora_alpha"], meta["use_rslora"]) == (4, 8, False)
    data = token_batch(seed=5)
    in_training = actor_logits(group._workers[0], data).batch["logits"]
    assert merge(tmp_path / "actor", tmp_path / "merged") == 0
    merged = model_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), data)
    assert 0 < float((merged - in_training).abs().max()) < 1e-5  # W + 2 B A folded: float rounding only
    assert merge(tmp_path / "actor", tmp_path / "split", "--lora", "adapter") == 0
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "split")
    original = AutoModelForCausalLM.from_pretrained(model_dir)
    assert all(torch.equal(base.state_dict()[k], v) for k, v in original.state_dict().items())  # LoRA trains no base
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "split" / "lora_adapter")
    assert torch.equal(model_logits(with_adapter, data), in_training)  # the same computation as in training


def test_critic_checkpoint_merges_to_a_value_model(model_dir, tmp_path):
    group = local_group(CriticWorker, make_config(model_dir))
    group.save_checkpoint(str(tmp_path / "critic"))
    data = token_batch(seed=2)
    data.batch["responses"] = data.batch["input_ids"][:, -5:]
    values = group.compute_values(data).batch["values"]
    assert merge(tmp_path / "critic", tmp_path / "out", "--is-value-model") == 0
    value_model = AutoModelForTokenClassification.from_pretrained(tmp_path / "out")
    assert value_model.config.num_labels == 1
    logits = model_logits(value_model, data)[..., 0]
    assert torch.equal(logits[:, -6:-1], values)  # the value of response token t is read at the position before it


def test_vision_language_checkpoint_keeps_its_processor(tmp_path):
    from rlvr.utils.tiny_vlm import save_tiny_qwen_vl

    path = save_tiny_qwen_vl(tmp_path / "vlm", "qwen2_vl")
    group = local_group(ActorRolloutRefWorker, make_config(path), "actor")
    group.save_checkpoint(str(tmp_path / "actor"))
    assert merge(tmp_path / "actor", tmp_path / "out") == 0
    processor, original = hf_processor(str(tmp_path / "out")), hf_processor(path)
    assert processor.image_processor.to_dict() == original.image_processor.to_dict()
    assert processor.chat_template == original.chat_template and len(processor.tokenizer) == len(original.tokenizer)
    ids = torch.randint(10, 400, (2, 6))
    merged = type(group._workers[0].actor_module).from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids).logits, group._workers[0].actor_module(input_ids=ids).logits)


@pytest.mark.parametrize(("tp", "pp", "tied"), [(1, 1, True), (2, 2, False), (2, 2, True)])
def test_megatron_shards_join_exactly(model_dir, untied_model_dir, tmp_path, tp, pp, tied):
    """Shards cut from an HF model as the Megatron workers' checkpoints hold them join back into it."""
    source = model_dir if tied else untied_model_dir
    hf = AutoModelForCausalLM.from_pretrained(source)
    shape = LlamaShape.from_hf_config(hf.config, tp)
    folder = tmp_path / "actor"
    folder.mkdir()
    for stage in range(pp):
        rules = stage_rules(shape, pp, stage)
        for rank in range(tp):
            torch.save({"layout": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
                        "model": {f"gpt.{k}": v for k, v in shard_state(hf.state_dict(), rules, tp, rank).items()},
                        "optimizer": None, "scheduler": None}, folder / f"megatron_tp{rank}_pp{stage}.pt")
    tied_flag = ["--tie-word-embedding"] if tied else []
    assert merge(folder, tmp_path / "out", "--hf_model_config_path", source, *tied_flag, backend="megatron") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert all(torch.equal(merged.state_dict()[k], v) for k, v in hf.state_dict().items())
    (folder / f"megatron_tp{tp - 1}_pp{pp - 1}.pt").unlink()
    assert merge(folder, tmp_path / "again", "--hf_model_config_path", source, backend="megatron") == 1


def test_bad_checkpoints_exit_non_zero_naming_path_and_file(model_dir, tmp_path, capsys):
    group = local_group(ActorRolloutRefWorker, make_config(model_dir), "actor")
    manager = CheckpointManager(tmp_path / "ckpt")
    tmp = manager.begin(1)
    group.save_checkpoint(str(tmp / "actor"))
    step = manager.commit(tmp, 1, {"global_steps": 1})
    assert merge(step, tmp_path / "whole") == 0  # a global_step folder: its actor/ is merged

    assert merge(tmp_path / "nowhere", tmp_path / "out") == 1
    assert f"{tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    model_file = step / "actor" / "model.pt"
    with model_file.open("r+b") as f:  # one byte altered: the manifest's SHA-256 catches it
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    assert merge(step / "actor", tmp_path / "out") == 1
    assert "actor/model.pt does not match its SHA-256" in capsys.readouterr().err
    (step / "manifest.json").unlink()  # without a manifest, a truncated file is caught when it is read
    model_file.write_bytes(model_file.read_bytes()[:1000])
    assert merge(step / "actor", tmp_path / "out") == 1
    assert f"checkpoint file {model_file} cannot be read" in capsys.readouterr().err
    model_file.unlink()
    assert merge(step / "actor", tmp_path / "out") == 1
    assert f"checkpoint file {model_file} is missing" in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    assert merge(tmp_path / "ckpt" / "global_step_1" / "actor", tmp_path / "notes") == 1
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_test_operation_compares_with_a_reference_folder(model_dir, tmp_path, capsys):
    group = local_group(ActorRolloutRefWorker, make_config(model_dir), "actor")
    ppo_step(group)
    group.save_checkpoint(str(tmp_path / "actor"))
    group.export_hf(str(tmp_path / "export"))
    args = ["test", "--backend", "fsdp", "--local_dir", str(tmp_path / "actor")]
    assert main([*args, "--test_hf_dir", str(tmp_path / "export")]) == 0
    assert main([*args, "--test_hf_dir", model_dir]) == 1  # the step changed the weights
    assert "differs between" in capsys.readouterr().err
