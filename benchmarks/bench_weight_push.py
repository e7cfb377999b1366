"""The asynchronous trainer's weight push to a rollout process on the same machine, measured alone.

A random-init model of a ``benchmarks/workload.py`` size is pushed ``--repeats`` times to a spawned
child process through the way the trainer would use (:class:`~rlvr.trainer.async_schedule.weight_push.WeightPacker`:
shared memory for CPU weights, CUDA IPC for CUDA weights on the child's GPU). The child holds an
engine stand-in (a copy of every tensor on its device) behind the rollout's
:class:`~rlvr.workers.rollout.partial.WeightInbox`, which loads each handle as the rollout worker does.
The weights change between pushes, and after each push the child's copies are checked bit for bit
against the trainer's (sha256 of every tensor's bytes, outside the timings).

Per push: ``blocking_s`` (the trainer: its weights read as the actor hands them over, packed, the
handle sent), ``confirm_s`` (until the child replied that its engine holds them), ``bytes`` and
``gb_per_s`` (bytes / ``confirm_s``).

    python -m benchmarks.bench_weight_push --size smollm2-135m --device cuda --repeats 5 --json push.json
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Self

import torch

from benchmarks.workload import WORKLOADS, json_main, model_config

CHILD_TIMEOUT_S = 300.0
"""How long the trainer side waits for any reply of the child (start-up included)."""


class _CopyEngine:
    """The child's engine stand-in: one tensor per weight on its device; ``update_weights`` copies."""

    def __init__(self, layout: list[tuple[str, tuple[int, ...], str]], device: str) -> None:
        self.tensors = {name: torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
                        for name, shape, dtype in layout}
        self.weights_version = 0

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        for name, tensor in weights.items():
            self.tensors[name].copy_(tensor)
        self.weights_version = version


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name and bytes, in order (bit-identical copies give the same)."""
    h = hashlib.sha256()
    for name, tensor in tensors.items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def child_main(fd: int) -> None:
    """The rollout process, on the socket ``fd``: first ``(layout, device)``, then
    ``("push", handle, version)`` -> ``("loaded", version)``; ``("digest",)`` -> ``("digest", sha256)``;
    ``("stop",)`` (or the trainer's end) ends it."""
    from rlvr.workers.rollout.cuda_ipc_weights import forget_opened
    from rlvr.workers.rollout.partial import WeightInbox

    conn = Connection(fd)
    layout, device = conn.recv()
    engine = _CopyEngine(layout, device)
    inbox = WeightInbox(engine, partial_rollout=False)
    conn.send(("ready",))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message[0] == "push":
                inbox.deliver(message[1], message[2])
                conn.send(("loaded", engine.weights_version))
            elif message[0] == "digest":
                conn.send(("digest", digest(engine.tensors)))
            else:
                return
    finally:
        forget_opened()


_CHILD_CODE = "import sys; from benchmarks.bench_weight_push import child_main; child_main(int(sys.argv[1]))"


class PushChild:
    """A rollout process and the trainer's side of its socket (``with PushChild(...) as c``): a fresh
    Python started with ``python -c``, as the local backend starts its rollout worker (its own
    resource tracker; a ``multiprocessing`` child would share the trainer's)."""

    def __init__(self, weights: dict[str, torch.Tensor], device: str) -> None:
        self.layout = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in weights.items()]
        self.device = device
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        mine, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send((self.layout, self.device))
        self.expect("ready")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.conn.send(("stop",))
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.conn.close()

    def expect(self, kind: str) -> tuple:
        if not self.conn.poll(CHILD_TIMEOUT_S):
            self.process.kill()
            raise TimeoutError(f"bench_weight_push: the rollout child sent no '{kind}' within {CHILD_TIMEOUT_S:.0f} s")
        reply = self.conn.recv()
        if reply[0] != kind:
            raise RuntimeError(f"bench_weight_push: the rollout child replied {reply[0]!r}, expected {kind!r}")
        return reply

    def digest(self) -> str:
        self.conn.send(("digest",))
        return self.expect("digest")[1]


def actor_weights(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """What the actor hands the push, as ``get_actor_weights`` does: a CPU copy for a CPU run, the
    tensors themselves on a GPU run (``on_device``)."""
    state = model.state_dict()
    if device.type == "cuda":
        return {name: t.detach() for name, t in state.items()}
    return {name: t.detach().to("cpu", copy=True) for name, t in state.items()}


def push_all(model: torch.nn.Module, device: torch.device, repeats: int) -> dict[str, Any]:
    """``repeats`` pushes to a fresh child, the weights changed before each; per-push timings."""
    from rlvr.trainer.async_schedule.weight_push import WeightPacker

    packer = WeightPacker(on_ray=False, rollout_device=device)
    first = actor_weights(model, device)
    nbytes = sum(t.numel() * t.element_size() for t in first.values())
    pushes = []
    try:
        with PushChild(first, str(device)) as child:
            for version in range(1, repeats + 1):
                with torch.no_grad():
                    for param in model.parameters():
                        param.add_(0.01 * version)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                weights = actor_weights(model, device)
                child.conn.send(("push", packer.pack(weights), version))
                blocking = time.perf_counter() - start
                child.expect("loaded")
                confirm = time.perf_counter() - start
                same = child.digest() == digest(weights)
                pushes.append({"version": version, "blocking_s": blocking, "confirm_s": confirm, "bytes": nbytes,
                               "gb_per_s": nbytes / confirm / 1e9, "bit_identical": same})
    finally:
        packer.close()
    return {"path": packer.path, "bytes": nbytes, "pushes": pushes}


def build_model(size: str, device: torch.device) -> torch.nn.Module:
    """A random-init Llama of the workload's shape and dtype (SmolLM2's vocabulary size), on ``device``."""
    from transformers import LlamaForCausalLM

    work = WORKLOADS[size]
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config(work, 49152, 0, 1, 2))
    return model.to(device=device, dtype=getattr(torch, work.dtype))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_weight_push: --device cuda needs a CUDA device; this machine has none")
    model = build_model(args.size, device)
    result = push_all(model, device, args.repeats)
    later = result["pushes"][1:] or result["pushes"]  # the first push also makes the buffer
    result.update(size=args.size, device=str(device), torch=torch.__version__,
                  median_blocking_s=statistics.median(p["blocking_s"] for p in later),
                  median_confirm_s=statistics.median(p["confirm_s"] for p in later),
                  all_bit_identical=all(p["bit_identical"] for p in result["pushes"]))
    for p in result["pushes"]:
        print(f"push {p['version']}: blocking {p['blocking_s']:.4f} s, confirmed {p['confirm_s']:.4f} s, "
              f"{p['bytes'] / 1e6:.1f} MB, {p['gb_per_s']:.2f} GB/s, bit-identical {p['bit_identical']}")
    print(f"{args.size} on {device} via {result['path']}: median blocking {result['median_blocking_s']:.4f} s, "
          f"median confirmed {result['median_confirm_s']:.4f} s")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "smollm2-135m"], default="tiny")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="pushes (the first also makes the buffer)")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return json_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
