"""Fuse several role worker classes into one class, so the roles share one process per device.

``create_colocated_worker_raw_cls({"actor": ClassWithInitArgs(A, ...), "ref": ClassWithInitArgs(R, ...)})``
returns a plain worker class (verl's ``FusedWorker``) whose instance builds one ``A`` and one ``R``
in the same process (``fused_worker_dict``) and exposes their registered methods as
``actor_<method>`` / ``ref_<method>`` with the same ``@register`` settings.
``create_colocated_worker_cls`` wraps it with its (empty) constructor arguments, ready for a worker
group; ``WorkerGroup.spawn(["actor", "ref"])`` then gives one group per role with the plain method
names, and ``WorkerGroup.fuse(["actor", "ref"])`` puts those groups on the group as ``group.actor``
/ ``group.ref`` (verl's fused workers). Inside the worker, ``self.actor`` is the role's worker, so
a subclass of the fused class can add methods that call several roles in one process. A role class
may be given plain or wrapped with ``ray.remote`` (see ``ClassWithInitArgs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rlvr.single_controller.base.decorator import REGISTER_ATTR, RegisterSpec, registered_methods
from rlvr.single_controller.base.worker import Worker
from rlvr.single_controller.base.worker_group import ClassWithInitArgs
from rlvr.utils.errors import ProtocolError, ProtocolTypeError

__all__ = ["create_colocated_worker_cls", "create_colocated_worker_raw_cls"]


def _forward(role: str, name: str, spec: RegisterSpec | None, is_async: bool = False) -> Callable:
    """A method of the fused class that calls ``name`` on the role's worker (a coroutine
    function when the role's method is one)."""
    if is_async:

        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.fused_worker_dict[role], name)(*args, **kwargs)

    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.fused_worker_dict[role], name)(*args, **kwargs)

    method.__name__ = f"{role}_{name}"
    if spec is not None:
        # The role's own method already frees the cache; the forwarder only carries the settings.
        setattr(method, REGISTER_ATTR, spec)
    return method


def create_colocated_worker_raw_cls(class_dict: dict[str, ClassWithInitArgs]) -> type[Worker]:
    """Fuse the role classes of ``class_dict`` into one plain worker class (one process per device).

    Args:
        class_dict: role name -> the role's worker class with its constructor arguments.

    Returns:
        ``FusedWorker_<role>_<role>...``: a ``Worker`` subclass whose constructor (the ``Worker``
        arguments) builds every role; ``raw_cls_dict`` maps each role to its class.

    Raises:
        ProtocolError: ``class_dict`` is empty.
        ProtocolTypeError: a role's class is not a ``Worker`` subclass.
    """
    if not class_dict:
        raise ProtocolError("create_colocated_worker_raw_cls needs at least one role")
    raw_cls_dict = {role: c.cls for role, c in class_dict.items()}
    init_args = {role: (c.args, c.kwargs) for role, c in class_dict.items()}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        Worker.__init__(self, *args, **kwargs)
        self.fused_worker_dict = {role: raw_cls_dict[role](*a, **kw) for role, (a, kw) in init_args.items()}

    def __getattr__(self: Any, name: str) -> Any:
        """``self.<role>``: the role's worker (verl's fused workers call ``self.actor.add(x)``)."""
        workers = self.__dict__.get("fused_worker_dict", {})
        if name in workers:
            return workers[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} (roles: {sorted(workers)})")

    attrs: dict[str, Any] = {"__init__": __init__, "__getattr__": __getattr__, "raw_cls_dict": raw_cls_dict,
                             "is_fused_worker": True}
    for role, cls in raw_cls_dict.items():
        if not issubclass(cls, Worker):
            raise ProtocolTypeError(f"role {role!r}: {cls.__name__} is not a subclass of Worker")
        for name, spec in registered_methods(cls).items():
            attrs[f"{role}_{name}"] = _forward(role, name, spec, inspect.iscoroutinefunction(getattr(cls, name)))
        attrs[f"{role}_get_rank_info"] = _forward(role, "get_rank_info", None)
    return type("FusedWorker_" + "_".join(raw_cls_dict), (Worker,), attrs)


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """The class of :func:`create_colocated_worker_raw_cls`, ready for a worker group."""
    return ClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))
