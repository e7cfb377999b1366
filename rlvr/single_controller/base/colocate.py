"""Fuse several role worker classes into one class, so the roles share one process per device.

``create_colocated_worker_cls({"actor": ClassWithInitArgs(A, ...), "ref": ClassWithInitArgs(R, ...)})``
returns a class whose instance builds one ``A`` and one ``R`` in the same process and exposes their
registered methods as ``actor_<method>`` / ``ref_<method>`` with the same ``@register`` settings.
``WorkerGroup.spawn(["actor", "ref"])`` then gives one group per role with the plain method names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.single_controller.base.decorator import REGISTER_ATTR, RegisterSpec, registered_methods
from rlvr.single_controller.base.worker import Worker
from rlvr.single_controller.base.worker_group import ClassWithInitArgs


def _forward(role: str, name: str, spec: RegisterSpec | None) -> Callable:
    """A method of the fused class that calls ``name`` on the role's worker."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker_dict[role], name)(*args, **kwargs)

    method.__name__ = f"{role}_{name}"
    if spec is not None:
        # The role's own method already frees the cache; the forwarder only carries the settings.
        setattr(method, REGISTER_ATTR, spec)
    return method


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """Fuse the role classes of ``class_dict`` into one worker class (one process per device).

    Args:
        class_dict: role name -> the role's worker class with its constructor arguments.

    Returns:
        the fused class with its constructor arguments, ready for a worker group.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    role_classes = {role: c.cls for role, c in class_dict.items()}
    init_args = {role: (c.args, c.kwargs) for role, c in class_dict.items()}

    def __init__(self: Any, role_init_args: dict[str, tuple[tuple, dict]]) -> None:
        Worker.__init__(self)
        self.worker_dict = {role: role_classes[role](*a, **kw) for role, (a, kw) in role_init_args.items()}

    attrs: dict[str, Any] = {"__init__": __init__, "_rlvr_role_classes": role_classes}
    for role, cls in role_classes.items():
        if not issubclass(cls, Worker):
            raise TypeError(f"role {role!r}: {cls.__name__} is not a subclass of Worker")
        for name, spec in registered_methods(cls).items():
            attrs[f"{role}_{name}"] = _forward(role, name, spec)
        attrs[f"{role}_get_rank_info"] = _forward(role, "get_rank_info", None)
    fused = type("Colocated_" + "_".join(role_classes), (Worker,), attrs)
    return ClassWithInitArgs(fused, init_args)
