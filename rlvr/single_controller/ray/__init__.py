"""Ray backend of the single controller (the names of ``rlvr.single_controller.ray.base``)."""

from rlvr.single_controller.ray.base import *  # noqa: F403
from rlvr.single_controller.ray.base import __all__  # noqa: F401
