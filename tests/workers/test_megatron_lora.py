"""Megatron LoRA (rlvr.workers.megatron.lora) against an independent reference: the HF tiny Llama in
float32 whose adapted linear weights are ``W + (alpha / r) B @ A`` (a functional call with the same
full ``A``, ``B``), at tensor-parallel sizes 1 and 2 (gloo ranks): log-probs, the PPO loss and the
gradients of every ``A`` and ``B`` (1e-5); the merged HF weights the weight sync and the export read
equal the reference's and give its log-probs, the same for both layouts; and the full adapters of
both layouts are the ones the seed defines (a rank's tensors are slices of them)."""

from __future__ import annotations

import gc
import socket

import pytest
import torch
import torch.multiprocessing as mp
from model_worker_utils import local_group, prompt_batch
from packed_batches import tiny_model
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

from megatron_lora_ranks import TEMPERATURE, batch, ppo_loss, run_rank, spec  # noqa: E402
from test_megatron_workers import (assert_export_is, assert_rollout_follows_the_actor, max_diff,  # noqa: E402
                                   megatron_config, training_batch)

from rlvr.model_merger import main as merge_main  # noqa: E402
from rlvr.utils.errors import WorkerError  # noqa: E402
from rlvr.utils.tiny_moe import save_tiny_moe  # noqa: E402
from rlvr.workers.megatron.hf_mapping import LlamaShape  # noqa: E402
from rlvr.workers.megatron.local_ranks import shutdown_local_ranks  # noqa: E402
from rlvr.workers.megatron.lora_layout import full_adapter  # noqa: E402
from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker  # noqa: E402

TOL = 1e-5
HF_LINEARS = {"linear_qkv": {"q": ["q_proj"], "k": ["k_proj"], "v": ["v_proj"], "fused": ["q_proj", "k_proj", "v_proj"]},
              "linear_fc1": {"gate": ["gate_proj"], "up": ["up_proj"], "fused": ["gate_proj", "up_proj"]},
              "linear_proj": {"fused": ["o_proj"]}, "linear_fc2": {"fused": ["down_proj"]}}
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SUB = {"linear_qkv": "self_attn", "linear_proj": "self_attn", "linear_fc1": "mlp", "linear_fc2": "mlp"}


def _spawn(tp: int, kind: str, model_dir: str, out, dropout_position: str | None = None) -> dict:
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, args=(tp, tp, port, model_dir, str(out), kind, dropout_position), nprocs=tp,
                       start_method="spawn")
    return torch.load(out / "rank0.pt")


def hf_deltas(model, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]], scale: float) -> dict[str, torch.Tensor]:
    """HF weight name -> ``scale * B @ A`` summed over the adapters on it (a fused ``B``'s rows split in
    the HF weights' order)."""
    deltas: dict[str, torch.Tensor] = {}
    for key, (a, b) in adapters.items():
        weight, part = key.split(":")
        layer, module = int(weight.split(".")[3]), weight.split(".")[-2]
        names = [f"model.layers.{layer}.{SUB[module]}.{n}.weight" for n in HF_LINEARS[module][part]]
        rows = [model.state_dict()[n].shape[0] for n in names]
        for name, b_rows in zip(names, torch.split(b, rows)):
            deltas[name] = deltas.get(name, 0) + scale * b_rows @ a
    return deltas


def reference_log_probs(model, params: dict[str, torch.Tensor], data: dict) -> torch.Tensor:
    inputs = {key: data[key] for key in ("input_ids", "attention_mask", "position_ids")}
    logits = torch.func.functional_call(model, params, args=(), kwargs=inputs).logits
    responses = data["responses"]
    logits = logits[:, -responses.shape[1] - 1 : -1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    diff = (a - b).detach()
    return float((diff[mask.bool()] if mask is not None else diff).abs().max())


@pytest.mark.parametrize(("kind", "arch"), [("lora", "llama"), ("canonical_lora", "llama"), ("lora", "qwen2")])
def test_megatron_lora_equals_the_merged_hf_reference(model_dir, tmp_path, kind, arch):
    if arch == "qwen2":  # q/k/v biases (added inside the fused layer's output) and tied embeddings
        tiny_model("qwen2", seed=1).save_pretrained(tmp_path / "qwen2")
        model_dir = str(tmp_path / "qwen2")
    runs = {tp: _spawn(tp, kind, model_dir, tmp_path / f"tp{tp}") for tp in (1, 2)}
    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    base = {name: t.detach() for name, t in hf.named_parameters()}  # a tied head once
    shape = LlamaShape.from_hf_config(hf.config, 1)
    lora, data = spec(kind), batch()
    mask = data["response_mask"]
    for tp, run in runs.items():
        # only the adapters train; the frozen weights get no gradient
        assert run["trainable"] == run["with_grad"] and run["trainable"]
        assert all(".adapter." in name for name in run["trainable"])
        assert run["changed"] == run["trainable"]  # one optimizer step moves every adapter and nothing else
        # the full adapters are the seed's, whatever the layout (B non-zero: the adapters matter)
        assert sorted(run["adapters"]) == sorted(runs[1]["adapters"])
        for key, (a, b) in run["adapters"].items():
            weight, part = key.split(":")
            want_a, want_b = full_adapter(lora, shape, hf.config.hidden_size, hf.config.intermediate_size,
                                          int(weight.split(".")[3]), weight.split(".")[-2], part)
            assert torch.equal(a, want_a) and torch.equal(b, want_b) and b.abs().max() > 0.05, key
        leaves = {key: (a.clone().requires_grad_(True), b.clone().requires_grad_(True))
                  for key, (a, b) in run["adapters"].items()}
        deltas = hf_deltas(hf, leaves, lora.scale)
        params = {name: base[name] + deltas[name] if name in deltas else base[name] for name in base}
        log_probs = reference_log_probs(hf, params, data)
        loss = ppo_loss(log_probs, run["old"], data)
        loss.backward()
        grads = {key: max(gap(leaves[key][0].grad, g_a), gap(leaves[key][1].grad, g_b))
                 for key, (g_a, g_b) in run["grads"].items()}
        scale = max(float(leaves[k][i].grad.abs().max()) for k in leaves for i in (0, 1))
        # the merged weights (weight sync, export) are the reference's, and they give its log-probs
        merged = run["merged"]
        merged_gap = max(gap(merged[name], params[name].detach()) for name in deltas)
        assert all(torch.equal(merged[name], base[name]) for name in base if name not in deltas and name in merged)
        exported = reference_log_probs(hf, {**base, **merged}, data)
        print(f"\n{kind} {arch} tp={tp}: log-probs {gap(run['log_probs'], log_probs, mask):.1e}, loss "
              f"{abs(run['loss'] - loss.item()):.1e}, adapter grads {max(grads.values()):.1e} (of {scale:.1e}), "
              f"merged weights {merged_gap:.1e}, merged log-probs {gap(exported, run['log_probs'], mask):.1e}")
        assert gap(run["log_probs"], log_probs.detach(), mask) < TOL
        assert abs(run["loss"] - loss.item()) < TOL
        assert max(grads.values()) < TOL * max(1.0, scale), grads
        assert len(deltas) == {"lora": 2 * 7, "canonical_lora": 2 * 5}[kind]  # the adapted HF weights of 2 layers
        assert merged_gap < 1e-6
        assert gap(exported, run["log_probs"], mask) < TOL
    assert max(gap(runs[2]["merged"][n], runs[1]["merged"][n]) for n in runs[1]["merged"]) < 1e-6


@pytest.mark.parametrize("position", ["pre", "post"])
def test_megatron_lora_dropout_drops_the_same_elements_in_every_layout(model_dir, tmp_path, position):
    runs = {tp: _spawn(tp, "lora", model_dir, tmp_path / f"tp{tp}", position) for tp in (1, 2)}
    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    base = {name: t.detach() for name, t in hf.named_parameters()}
    data, mask = batch(), batch()["response_mask"]
    deltas = hf_deltas(hf, runs[1]["adapters"], spec("lora").scale)
    without = reference_log_probs(hf, {n: base[n] + deltas[n] if n in deltas else base[n] for n in base}, data)
    one, two = runs[1], runs[2]
    grads = max(gap(one["grads"][k][i], two["grads"][k][i]) for k in one["grads"] for i in (0, 1))
    print(f"\ndropout {position}: tp=2 against tp=1: log-probs {gap(one['log_probs'], two['log_probs'], mask):.1e}, "
          f"adapter grads {grads:.1e}; against no dropout {gap(one['log_probs'], without, mask):.1e}")
    assert gap(one["log_probs"], without, mask) > 1e-3  # the dropout changes the adapters' output
    assert gap(one["log_probs"], two["log_probs"], mask) < TOL
    assert abs(one["loss"] - two["loss"]) < TOL and grads < TOL


@pytest.fixture
def fresh_ranks():
    """A worker test starts its own model-parallel ranks (the layout is global to a process)."""
    yield
    gc.collect()
    shutdown_local_ranks()


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_megatron_lora_worker_trains_only_the_adapters_against_the_base_reference(model_dir, tmp_path, fresh_ranks,
                                                                                  tp, pp):
    config = megatron_config(model_dir, tp, pp, "actor_rollout_ref.model.lora.rank=4",
                             "actor_rollout_ref.model.lora.alpha=8",  # the same micro-batches: the same rounding
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2")
    mega = local_group(MegatronActorRolloutRefWorker, config, "actor_rollout_ref")
    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    start = mega.get_actor_weights()[0]
    assert start.keys() == base.keys() and all(torch.equal(start[k], base[k]) for k in base)  # B = 0: the base model
    out = mega.generate_sequences(prompt_batch())
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    old = mega.compute_log_prob(out).batch["old_log_probs"]
    ref = mega.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert torch.equal(old, ref)  # the initial actor is the base model exactly

    # one update moves the adapted weights only; the reference stays the base model
    batch = training_batch(out, old, ref)
    mega.update_actor(batch)
    after = mega.get_actor_weights()[0]
    adapted = {k for k in base if any(f".{name}." in k for name in ADAPTED)}
    assert len(adapted) == 14 and all(not torch.equal(after[k], base[k]) for k in adapted)
    assert all(torch.equal(after[k], base[k]) for k in base if k not in adapted)
    assert torch.equal(mega.compute_ref_log_prob(out).batch["ref_log_prob"], ref)
    moved = mega.compute_log_prob(out).batch["old_log_probs"]
    assert max_diff(moved, old, mask) > 1e-4

    # the rollout's replica gets the merged weights: its sampling log-probs are the actor's
    assert_rollout_follows_the_actor(mega)

    # the export and the merged checkpoint are the merged weights; a checkpoint resumes the adapters
    assert_export_is(mega, after, tmp_path / "hf")
    mega.save_checkpoint(str(tmp_path / "ckpt"))
    assert merge_main(["merge", "--backend", "megatron", "--tie-word-embedding", "--local_dir", str(tmp_path / "ckpt"),
                       "--target_dir", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    assert max(float((merged[k] - after[k]).abs().max()) for k in after) < 1e-6
    mega.update_actor(batch)
    assert any(not torch.equal(mega.get_actor_weights()[0][k], after[k]) for k in adapted)
    mega.load_checkpoint(str(tmp_path / "ckpt"))
    assert all(torch.equal(mega.get_actor_weights()[0][k], after[k]) for k in after)


def test_megatron_lora_on_a_mixture_of_experts_model_is_refused_with_the_reason(tmp_path, fresh_ranks):
    moe = str(save_tiny_moe(tmp_path / "moe", "qwen3_moe"))
    config = megatron_config(moe, 1, 1, "actor_rollout_ref.model.lora.rank=4")
    with pytest.raises(WorkerError, match="LoRA on a mixture-of-experts model .adapters on the experts are not in rlvr"):
        local_group(MegatronActorRolloutRefWorker, config, "actor_rollout_ref")
