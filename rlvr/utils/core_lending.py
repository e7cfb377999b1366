"""Idle cores lent between the trainer and a rollout apart from it, on one CPU machine.

With ``actor_rollout_ref.hybrid_engine=false`` on the local backend the trainer (the driver) and the
rollout (one child process) each get half the cores, so that they compute at the same time. When
one side waits for the other (the trainer for samples, the rollout for admission or the next
weights), its cores idle. With ``async_training.lend_idle_cores`` the side that computes takes them
for as long as the other waits: the rollout re-checks before every decode step, the trainer before
every decoder layer of its actor, forward and backward (:func:`check_per_layer`), and before each
optimizer step. A side that stops waiting gets its cores back at the other's next check (one decode
step, one layer).

The two processes share one small file (in ``/dev/shm`` where it exists): byte ``TRAINER`` is 1
while the trainer waits, byte ``ROLLOUT`` while the rollout does. The driver writes both (its
rollouter thread knows when the rollout waits) and owns the file; the rollout child finds it
through the ``RLVR_CORE_LENDING`` environment variable it inherits, and only reads.

Thread counts change float rounding (how a matrix product's work is split), and when they change
depends on timing: with lending on, a run is not bit-for-bit repeatable. It is off by default.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
import weakref

import torch
from torch import nn

__all__ = ["TRAINER", "ROLLOUT", "ENV_VAR", "CoreLending", "install", "installed", "fit_threads",
           "check_per_layer", "repeated_blocks", "take_lent_share", "attach_rollout_from_env"]

logger = logging.getLogger(__name__)

TRAINER, ROLLOUT = 0, 1
ENV_VAR = "RLVR_CORE_LENDING"
_SIZE = 2


class CoreLending:
    """One side's view of the shared waiting flags.

    Args:
        path: the shared file (``_SIZE`` bytes).
        side: ``TRAINER`` or ``ROLLOUT``: whose threads :meth:`fit_threads` sets.
        own_threads: the side's own share of the cores (its threads while the other computes).
        all_threads: its threads while the other side waits.
        owner: this side created the file and removes it in :meth:`close`.
    """

    def __init__(self, path: str, side: int, own_threads: int, all_threads: int, owner: bool = False) -> None:
        if side not in (TRAINER, ROLLOUT):
            raise ValueError(f"side must be TRAINER ({TRAINER}) or ROLLOUT ({ROLLOUT}), got {side!r}")
        if not 1 <= own_threads <= all_threads:
            raise ValueError(f"need 1 <= own_threads <= all_threads, got {own_threads} and {all_threads}")
        self.path, self.side, self.owner = path, side, owner
        self.own_threads, self.all_threads = own_threads, all_threads
        with open(path, "r+b") as f:
            self._flags = mmap.mmap(f.fileno(), _SIZE)
        self.lent_checks = 0  # checks that found the other side waiting
        self.checks = 0
        # module -> the hooks of check_layers on its layers (weak: a collected module's id may be reused)
        self._hooked: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()

    @classmethod
    def create(cls, own_threads: int, all_threads: int) -> CoreLending:
        """The driver's (trainer's) side: a new shared file, both sides computing."""
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="rlvr_cores_", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(_SIZE))
        return cls(path, TRAINER, own_threads, all_threads, owner=True)

    def set_waiting(self, side: int, waiting: bool) -> None:
        """Mark ``side`` waiting (its cores may be lent) or computing (nothing once closed)."""
        if not self._flags.closed:
            self._flags[side] = 1 if waiting else 0

    def waiting(self, side: int) -> bool:
        return self._flags[side] == 1

    def fit_threads(self) -> int:
        """Set this process's threads (in the calling thread, which is the one that computes): all
        of them while the other side waits, else the own share. Returns the count."""
        other = ROLLOUT if self.side == TRAINER else TRAINER
        lent = self.waiting(other)
        threads = self.all_threads if lent else self.own_threads
        self.checks += 1
        self.lent_checks += lent
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def check_layers(self, module: nn.Module) -> None:
        """Fit the threads before every repeated block of ``module`` (:func:`repeated_blocks`: a
        transformer's decoder layers, a vision tower's), in the forward pass and, through a gradient
        hook on the block's output, before the block's backward. Once per module; :meth:`close`
        removes the hooks."""
        if module in self._hooked:
            return
        handles = []
        for block in repeated_blocks(module):
            handles.append(block.register_forward_pre_hook(self._before_forward))
            handles.append(block.register_forward_hook(self._before_backward))
        self._hooked[module] = handles

    def _before_forward(self, _module: nn.Module, _args) -> None:
        self.fit_threads()

    def _before_backward(self, _module: nn.Module, _args, output) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(self._fit_threads_for_grad)

    def _fit_threads_for_grad(self, grad: torch.Tensor) -> None:
        self.fit_threads()  # returns None: the gradient passes unchanged

    def take_lent_share(self, name: str) -> dict[str, float]:
        """``{"async/<name>_lent_core_share": share}``: the share of the checks since the last call
        that found the other side waiting (so ran on its cores too); ``{}`` after no check."""
        checks, lent = self.checks, self.lent_checks
        self.checks = self.lent_checks = 0
        return {f"async/{name}_lent_core_share": lent / checks} if checks else {}

    def close(self) -> None:
        """Remove the layer hooks and unmap; the owner removes the file."""
        for handles in list(self._hooked.values()):
            for handle in handles:
                handle.remove()
        self._hooked.clear()
        self._flags.close()
        if self.owner:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


_INSTALLED: CoreLending | None = None


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The entries of the outermost ``nn.ModuleList``s of two or more entries in ``module`` (a
    transformer's layers), not of lists nested inside those entries (an MoE layer's experts): one
    check per layer is enough."""
    if isinstance(module, nn.ModuleList) and len(module) > 1:
        return list(module)
    return [block for child in module.children() for block in repeated_blocks(child)]


def install(lending: CoreLending | None) -> None:
    """Make ``lending`` this process's (None: none; :func:`fit_threads` does nothing)."""
    global _INSTALLED
    _INSTALLED = lending


def installed() -> CoreLending | None:
    return _INSTALLED


def fit_threads() -> None:
    """Called by the compute loops (a decode step, an actor forward): fit this process's threads to
    whether the other side waits; nothing without an installed :class:`CoreLending`."""
    if _INSTALLED is not None:
        _INSTALLED.fit_threads()


def check_per_layer(module: nn.Module) -> None:
    """Fit the threads now and, with an installed :class:`CoreLending`, before every layer of
    ``module`` from now on (:meth:`CoreLending.check_layers`): a wait that starts or ends in the middle
    of a forward or backward pass moves the cores at the next layer."""
    if _INSTALLED is not None:
        _INSTALLED.fit_threads()
        _INSTALLED.check_layers(module)


def take_lent_share(name: str) -> dict[str, float]:
    """:meth:`CoreLending.take_lent_share` of the installed lending (``{}`` without one)."""
    return _INSTALLED.take_lent_share(name) if _INSTALLED is not None else {}


def attach_rollout_from_env(own_threads: int) -> CoreLending | None:
    """In a rollout child: install the rollout's side of the driver's file named in
    ``RLVR_CORE_LENDING`` (``<path>:<driver pid>``), with all the process's cores to borrow. None
    (and nothing installed) without the variable or in the driver itself; a file that is gone is
    logged and lending stays off."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    path, _, pid = value.rpartition(":")
    if pid == str(os.getpid()):
        return None
    cores = len(os.sched_getaffinity(0))
    try:
        lending = CoreLending(path, ROLLOUT, min(own_threads, cores), cores)
    except (OSError, ValueError) as err:
        logger.warning("lend_idle_cores: cannot open the trainer's flags %s (%s); the rollout keeps %d thread(s)",
                       path, err, own_threads)
        return None
    install(lending)
    return lending
