"""Per-token weight versions, the hf engine's interrupt, and partial rollouts: weights that change in
the middle of a generation. Each interrupted run is checked against uninterrupted runs of the same
seed: the tokens sampled before the update are those of the old weights, with their log-probs and
version, and every later token's log-prob is a plain forward of the new weights."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import forward_log_probs, tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout
from rlvr.workers.rollout.partial import WeightInbox

TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on"]
LENGTH = 10
CUT_AFTER = 3  # the forward call during which the weights arrive: tokens 0..2 come from the old weights


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=3)


def engine(model, tokenizer) -> HFRollout:
    config = RolloutConfig(response_length=LENGTH, prompt_length=32, micro_batch_size=8, ignore_eos=True)
    return HFRollout(OmegaConf.structured(config), model, tokenizer, "cpu", seed=5, owns_module=True)


def prompts(tokenizer, **meta) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    tensors = {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)}
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


def new_weights(model) -> dict[str, torch.Tensor]:
    """The model's weights moved by a seeded random step (clearly other log-probs)."""
    generator = torch.Generator().manual_seed(11)
    return {name: p.detach() + 0.05 * torch.randn(p.shape, generator=generator)
            for name, p in model.named_parameters()}


def on_forward(model, call: int, action) -> torch.utils.hooks.RemovableHandle:
    """Run ``action()`` during the model's ``call``-th forward (1 = the prefill)."""
    count = [0]

    def hook(module, args, output):
        count[0] += 1
        if count[0] == call:
            action()

    return model.register_forward_hook(hook)


def test_every_sampled_token_carries_the_engine_version(model_and_tokenizer):
    model, tok = model_and_tokenizer
    hf = engine(copy.deepcopy(model), tok)
    hf.update_weights(dict(model.named_parameters()), version=7)
    out = hf.generate_sequences(prompts(tok))
    mask = out.batch["response_mask"].bool()
    assert out.batch["response_versions"].dtype == torch.int64
    assert out.batch["response_versions"][mask].eq(7).all() and out.batch["response_versions"][~mask].eq(-1).all()
    assert out.meta_info["rollout_weights_version"] == 7 and "interrupted_rows" not in out.meta_info


def test_the_engine_stops_at_the_interrupt_and_lists_the_rows_it_cut(model_and_tokenizer):
    import threading

    model, tok = model_and_tokenizer
    full = engine(copy.deepcopy(model), tok).generate_sequences(prompts(tok))
    cut_engine = engine(copy.deepcopy(model), tok)
    interrupt = threading.Event()
    handle = on_forward(cut_engine.module, CUT_AFTER, interrupt.set)
    cut = cut_engine.generate_sequences(prompts(tok, interrupt=interrupt))
    handle.remove()
    assert cut.meta_info["interrupted_rows"] == [0, 1, 2, 3]
    assert cut.batch["response_mask"].sum(-1).tolist() == [CUT_AFTER] * 4  # the step in flight finishes
    assert torch.equal(cut.batch["responses"][:, :CUT_AFTER], full.batch["responses"][:, :CUT_AFTER])
    torch.testing.assert_close(cut.batch["rollout_log_probs"][:, :CUT_AFTER],
                               full.batch["rollout_log_probs"][:, :CUT_AFTER], rtol=0, atol=0)
    assert cut.batch["response_versions"][:, CUT_AFTER:].eq(-1).all()
    early = engine(copy.deepcopy(model), tok).generate_sequences(prompts(tok, interrupt=interrupt))  # already set
    assert early.meta_info["interrupted_rows"] == [0, 1, 2, 3] and early.batch["response_mask"].sum() == 0
    unset = threading.Event()
    whole = engine(copy.deepcopy(model), tok).generate_sequences(prompts(tok, interrupt=unset))
    assert whole.meta_info["interrupted_rows"] == [] and torch.equal(whole.batch["responses"], full.batch["responses"])


def test_partial_rollout_keeps_earlier_tokens_and_continues_with_the_new_weights(model_and_tokenizer):
    model, tok = model_and_tokenizer
    weights = new_weights(model)
    new_model = copy.deepcopy(model)
    new_model.load_state_dict(weights, strict=False)  # lm_head is tied to the embeddings
    old_run = engine(copy.deepcopy(model), tok).generate_sequences(prompts(tok))
    hf = engine(copy.deepcopy(model), tok)
    inbox = WeightInbox(hf, partial_rollout=True)
    handle = on_forward(hf.module, CUT_AFTER, lambda: inbox.deliver(weights, 1))
    with inbox.generation(validate=False) as partial:
        out = partial.generate_sequences(prompts(tok))
    handle.remove()
    assert inbox.last_interrupted_rows == 4 and hf.weights_version == 1
    batch, k = out.batch, CUT_AFTER
    assert batch["response_mask"].sum(-1).tolist() == [LENGTH] * 4  # every row finished its budget
    assert batch["response_versions"][:, :k].eq(0).all() and batch["response_versions"][:, k:].eq(1).all()
    # the tokens before the update are the old weights' draws, with the old weights' log-probs
    assert torch.equal(batch["responses"][:, :k], old_run.batch["responses"][:, :k])
    torch.testing.assert_close(batch["rollout_log_probs"][:, :k], old_run.batch["rollout_log_probs"][:, :k],
                               rtol=0, atol=0)
    # every later log-prob is the new weights' (a plain forward of the whole sequence), the earlier ones are not
    new_lp = forward_log_probs(new_model, batch, temperature=1.0)
    old_lp = forward_log_probs(model, batch, temperature=1.0)
    torch.testing.assert_close(batch["rollout_log_probs"][:, k:], new_lp[:, k:], rtol=0, atol=1e-5)
    torch.testing.assert_close(batch["rollout_log_probs"][:, :k], old_lp[:, :k], rtol=0, atol=1e-5)
    assert (new_lp[:, :k] - old_lp[:, :k]).abs().max() > 1e-2
    width = batch["prompts"].shape[1]
    assert torch.equal(batch["input_ids"][:, width:], batch["responses"])
    assert torch.equal(batch["attention_mask"], torch.cat([prompts(tok).batch["attention_mask"],
                                                           torch.ones(4, LENGTH, dtype=torch.long)], dim=1))


def test_weights_wait_for_the_end_of_a_generation_without_partial_rollouts(model_and_tokenizer):
    model, tok = model_and_tokenizer
    weights = new_weights(model)
    hf = engine(copy.deepcopy(model), tok)
    inbox = WeightInbox(hf, partial_rollout=False)
    inbox.deliver(dict(model.named_parameters()), 3)  # idle: loaded at once
    assert hf.weights_version == 3
    handle = on_forward(hf.module, CUT_AFTER, lambda: (inbox.deliver(weights, 4), inbox.deliver(weights, 5)))
    with inbox.generation(validate=False) as plain:
        assert plain is hf
        out = plain.generate_sequences(prompts(tok))
        assert hf.weights_version == 3  # not in the middle of the generation
    handle.remove()
    mask = out.batch["response_mask"].bool()
    assert out.batch["response_versions"][mask].eq(3).all()
    assert hf.weights_version == 5 and inbox.last_interrupted_rows == 0  # the newest delivery, at the end
    reference = copy.deepcopy(model)
    reference.load_state_dict(weights, strict=False)
    for name, p in hf.module.named_parameters():
        assert torch.equal(p, dict(reference.named_parameters())[name])


def test_validation_runs_on_one_version(model_and_tokenizer):
    model, tok = model_and_tokenizer
    hf = engine(copy.deepcopy(model), tok)
    inbox = WeightInbox(hf, partial_rollout=True)
    handle = on_forward(hf.module, CUT_AFTER, lambda: inbox.deliver(new_weights(model), 1))
    with inbox.generation(validate=True) as plain:
        out = plain.generate_sequences(prompts(tok))
    handle.remove()
    assert out.batch["response_versions"][out.batch["response_mask"].bool()].eq(0).all()
    assert hf.weights_version == 1


class _SleepyEngine:
    """Records wake-ups, sleeps and weight loads; a load or a generation while asleep is an error
    (on GPU an owned copy of the weights sits on CPU then: the bug this guards against)."""

    def __init__(self) -> None:
        self.awake, self.weights_version, self.events = False, 0, []

    def wake_up(self) -> None:
        self.awake = True
        self.events.append("wake")

    def sleep(self) -> None:
        self.awake = False
        self.events.append("sleep")

    def update_weights(self, weights, version: int) -> None:
        assert self.awake, "weights loaded into a sleeping engine"
        self.weights_version = version
        self.events.append(f"load {version}")


def test_a_generation_waiting_for_another_is_not_put_to_sleep_by_it():
    """Two calls at once on a rollout worker apart: the first generation's sleep must come before the
    second one's wake-up, and weights that arrive meanwhile load into an awake engine."""
    import threading

    engine = _SleepyEngine()
    inbox = WeightInbox(engine, partial_rollout=False)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def first():
        with inbox.generation(validate=False, sleep_after=True):
            inside.set()
            release.wait(10)
            seen["first"] = engine.awake

    def second():
        inside.wait(10)
        with inbox.generation(validate=True, sleep_after=True):
            seen["second"] = (engine.awake, engine.weights_version)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    inside.wait(10)
    assert inbox.deliver({}, version=4) == {}  # generating: the weights wait
    release.set()
    for thread in threads:
        thread.join(10)
    assert seen == {"first": True, "second": (True, 4)}
    assert engine.events == ["wake", "wake", "load 4", "sleep", "wake", "sleep"]
    assert inbox.deliver({}, version=5) == {} and engine.events[-2:] == ["wake", "load 5"]  # idle: loaded at once
