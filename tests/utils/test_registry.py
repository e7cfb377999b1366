"""rlvr.utils.registry.Registry: a dict (verl code calls .clear(), .update(), in, [name] on the
registries) with a helpful miss message, duplicate rejection and per-entry metadata."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rlvr.utils.registry import Registry, RegistryKeyError


@dataclass(frozen=True)
class Needs:
    needs_critic: bool = False


def f():
    return "f"


def g():
    return "g"


def test_a_registry_is_a_dict():
    reg = Registry("widget")
    reg.register("f")(f)
    assert isinstance(reg, dict) and "f" in reg and reg["f"] is f and list(reg) == ["f"]
    reg.update({"g": g})
    assert sorted(reg.items()) == [("f", f), ("g", g)] and reg.names() == ["f", "g"]
    reg.clear()
    assert len(reg) == 0 and "f" not in reg
    reg.register("f")(f)  # re-registering after a clear works
    assert reg["f"] is f


def test_a_miss_lists_the_valid_names_and_is_a_key_and_value_error():
    reg = Registry("widget")
    reg.add("f", f)
    reg.add("g", g)
    for error in (KeyError, ValueError, RegistryKeyError):
        with pytest.raises(error) as info:
            reg["h"]
    assert str(info.value) == "unknown widget 'h'; valid names: f, g"  # no KeyError quotes
    with pytest.raises(RegistryKeyError, match="valid names: f, g"):
        reg.get("h")
    assert reg.get("h", None) is None and reg.get("f", None) is f  # dict.get with a default


def test_duplicates_are_rejected_but_the_same_object_again_is_a_no_op():
    reg = Registry("widget")
    reg.register("f")(f)
    with pytest.raises(ValueError, match="widget 'f' is already registered"):
        reg.register("f")(g)
    assert reg.register("f")(f) is f and reg["f"] is f


def test_metadata_follows_the_registered_object():
    reg = Registry("estimator", Needs)
    reg.register("v", needs_critic=True)(f)
    reg.add("plain", g)
    assert reg.metadata("v") == Needs(needs_critic=True) and reg.metadata("plain") == Needs()
    reg["v"] = g  # replaced by plain assignment (verl style): the old entry's metadata does not stick
    assert reg.metadata("v") == Needs()
    reg.clear()
    reg["v"] = f  # the original object back under its name: its metadata comes back with it
    assert reg.metadata("v") == Needs(needs_critic=True)
    with pytest.raises(TypeError):
        reg.register("w", needs_gpu=True)(f)
    with pytest.raises(TypeError, match="carry no metadata"):
        Registry("widget").register("f", needs_critic=True)(f)
    with pytest.raises(RegistryKeyError):
        reg.metadata("missing")
