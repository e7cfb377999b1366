"""rlvr.utils.core_lending: the trainer's and the rollout's waiting flags in one shared file; a side
takes all the cores while the other waits and gives them back when it computes again, also across
two real processes (the rollout child finds the file through the environment)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rlvr.utils import core_lending
from rlvr.utils.core_lending import ENV_VAR, ROLLOUT, TRAINER, CoreLending


@pytest.fixture(autouse=True)
def threads_restored():
    threads = torch.get_num_threads()
    yield
    core_lending.install(None)
    torch.set_num_threads(threads)


def test_a_side_takes_the_cores_only_while_the_other_waits():
    trainer = CoreLending.create(own_threads=1, all_threads=3)
    rollout = CoreLending(trainer.path, ROLLOUT, own_threads=1, all_threads=3)
    try:
        assert trainer.path.startswith("/dev/shm/rlvr_cores_") or not os.path.isdir("/dev/shm")
        assert rollout.fit_threads() == 1 and torch.get_num_threads() == 1  # both compute at first
        trainer.set_waiting(TRAINER, True)  # the trainer waits for samples
        assert rollout.waiting(TRAINER) and rollout.fit_threads() == 3 and torch.get_num_threads() == 3
        assert trainer.fit_threads() == 1  # the rollout does not wait: the trainer keeps its share
        trainer.set_waiting(TRAINER, False)
        trainer.set_waiting(ROLLOUT, True)  # the rollout waits for the next weights
        assert rollout.fit_threads() == 1 and trainer.fit_threads() == 3
        assert rollout.take_lent_share("rollout") == {"async/rollout_lent_core_share": pytest.approx(1 / 3)}
        assert rollout.take_lent_share("rollout") == {}  # counted afresh after each take
        assert trainer.take_lent_share("trainer") == {"async/trainer_lent_core_share": 0.5}
    finally:
        rollout.close()
        trainer.close()
    assert not os.path.exists(trainer.path)  # the owner removes the file; the other side only unmaps
    trainer.set_waiting(TRAINER, True)  # a late mark after close (a stopping rollouter) does nothing


def test_without_an_installed_lending_the_hooks_change_nothing():
    torch.set_num_threads(1)
    core_lending.fit_threads()
    assert torch.get_num_threads() == 1 and core_lending.take_lent_share("rollout") == {}


def test_bad_thread_counts_and_sides_are_refused(tmp_path):
    lending = CoreLending.create(1, 2)
    try:
        with pytest.raises(ValueError, match="need 1 <= own_threads <= all_threads, got 3 and 2"):
            CoreLending(lending.path, ROLLOUT, 3, 2)
        with pytest.raises(ValueError, match="side must be TRAINER"):
            CoreLending(lending.path, 2, 1, 2)
    finally:
        lending.close()


CHILD = """
import sys
import torch
from rlvr.utils import core_lending
lending = core_lending.attach_rollout_from_env(1)
print("attached" if lending is core_lending.installed() and lending is not None else "none", flush=True)
for line in sys.stdin:
    core_lending.fit_threads()
    print(torch.get_num_threads(), flush=True)
"""


def test_the_rollout_child_borrows_the_trainers_cores_while_it_waits():
    cores = len(os.sched_getaffinity(0))
    trainer = CoreLending.create(max(1, cores // 2), cores)
    env = {**os.environ, ENV_VAR: f"{trainer.path}:{os.getpid()}"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "attached"

        def child_threads() -> int:
            child.stdin.write("step\n")
            child.stdin.flush()
            return int(child.stdout.readline())

        assert child_threads() == 1
        trainer.set_waiting(TRAINER, True)
        assert child_threads() == cores
        trainer.set_waiting(TRAINER, False)
        assert child_threads() == 1
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        trainer.close()
    assert child.returncode == 0


def test_no_lending_in_the_driver_itself_or_when_the_file_is_gone(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert core_lending.attach_rollout_from_env(1) is None
    monkeypatch.setenv(ENV_VAR, f"/dev/shm/whatever:{os.getpid()}")  # the driver's own process
    assert core_lending.attach_rollout_from_env(1) is None
    monkeypatch.setenv(ENV_VAR, f"{tmp_path / 'gone'}:1")
    assert core_lending.attach_rollout_from_env(1) is None and core_lending.installed() is None
    assert "cannot open the trainer's flags" in caplog.text


def _tiny_llama(layers: int = 3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def test_the_trainer_moves_cores_at_the_next_layer_forward_and_backward():
    """A wait that starts in the middle of a forward pass (after layer 0) gives layers 1-2 all the
    cores; one that ends in the middle of the backward pass (during layer 1's) gives them back before
    layer 0's backward. The optimizer step checks too; close removes the hooks."""
    from rlvr.workers.ppo_update import optimizer_step

    model = _tiny_llama()
    trainer = CoreLending.create(own_threads=1, all_threads=2)
    core_lending.install(trainer)
    seen: list[tuple[str, int, int]] = []

    def record(stage: str, index: int):
        return lambda *_: seen.append((stage, index, torch.get_num_threads()))

    def on_backward(hook):  # a forward hook that hooks the layer's output gradient (returns None)
        return lambda module, args, out: [out.register_hook(hook), None][1]

    try:
        core_lending.check_per_layer(model)
        core_lending.check_per_layer(model)  # once per module: no second set of hooks
        layers = model.model.layers
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(record("forward", index))
            layer.register_forward_hook(on_backward(record("backward", index)))
        layers[0].register_forward_hook(lambda *_: trainer.set_waiting(ROLLOUT, True))  # the rollout waits now
        layers[1].register_forward_hook(on_backward(lambda _: trainer.set_waiting(ROLLOUT, False)))  # and ends
        ids = torch.tensor([[1, 2, 3, 4]])
        model(input_ids=ids, labels=ids).loss.backward()
        assert seen == [("forward", 0, 1), ("forward", 1, 2), ("forward", 2, 2),
                        ("backward", 2, 2), ("backward", 1, 2), ("backward", 0, 1)]
        trainer.set_waiting(ROLLOUT, True)
        optimizer_step(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_clip=1.0)
        assert torch.get_num_threads() == 2
    finally:
        core_lending.install(None)
        trainer.close()
    assert [len(layer._forward_pre_hooks) for layer in layers] == [1, 1, 1]  # only the test's own are left


def test_only_the_outermost_repeated_blocks_are_checked():
    """Decoder layers and a vision tower's layers are checked; the experts inside a layer (a list
    nested in a listed block) and a one-entry list are not."""
    from torch import nn

    from rlvr.utils.core_lending import repeated_blocks

    class MoeLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))

    model = nn.Module()
    model.layers = nn.ModuleList(MoeLayer() for _ in range(3))
    model.vision = nn.Module()
    model.vision.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))
    model.head = nn.ModuleList([nn.Linear(2, 2)])
    assert repeated_blocks(model) == [*model.layers, *model.vision.blocks]
    assert repeated_blocks(model.layers[0]) == list(model.layers[0].experts)  # a layer alone: its experts
    lending = CoreLending.create(own_threads=1, all_threads=1)
    try:
        lending.check_layers(model)
        hooked = [m for m in model.modules() if m._forward_pre_hooks]
        assert hooked == [*model.layers, *model.vision.blocks]
    finally:
        lending.close()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_the_layer_checks_leave_the_gradients_unchanged():
    ids = torch.tensor([[5, 1, 7, 3, 2]])
    plain = _tiny_llama()
    plain(input_ids=ids, labels=ids).loss.backward()
    hooked = _tiny_llama()
    lending = CoreLending.create(own_threads=1, all_threads=1)  # same threads: the grads must match bitwise
    core_lending.install(lending)
    try:
        core_lending.check_per_layer(hooked)
        hooked(input_ids=ids, labels=ids).loss.backward()
        assert lending.checks == 1 + 2 * 3  # the call itself, then each layer's forward and backward
    finally:
        core_lending.install(None)
        lending.close()
    for (name, a), (_, b) in zip(plain.named_parameters(), hooked.named_parameters()):
        assert torch.equal(a.grad, b.grad), name
