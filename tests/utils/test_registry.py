"""rlvr.utils.registry.Registry: a dict (verl code calls .clear(), .update(), in, [name] on the
registries) with a helpful miss message, duplicate rejection and per-entry metadata."""

from __future__ import annotations

import sys
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
    assert str(info.value) == "Unknown widget: h; valid names: f, g"  # no KeyError quotes
    with pytest.raises(RegistryKeyError, match="valid names: f, g"):
        reg.get("h")
    assert reg.get("h", None) is None and reg.get("f", None) is f  # dict.get with a default


def test_duplicates_are_rejected_but_the_same_object_again_is_a_no_op():
    reg = Registry("widget")
    reg.register("f")(f)
    with pytest.raises(ValueError, match="widget 'f' is already registered"):
        reg.register("f")(g)
    assert reg.register("f")(f) is f and reg["f"] is f


def _redefined_f():
    """Another function object with f's module and qualified name, as a module executed a second
    time (a re-import, another process's copy) defines it."""

    def f():
        return "f again"

    f.__qualname__ = "f"
    return f


def test_the_same_definition_again_replaces_the_entry_with_a_debug_log(caplog):
    reg = Registry("widget", Needs)
    reg.register("f", needs_critic=True)(f)
    again = _redefined_f()
    with caplog.at_level("DEBUG", logger="rlvr.utils.registry"):
        reg.register("f", needs_critic=False)(again)
    assert reg["f"] is again and reg.metadata("f") == Needs(needs_critic=False)
    assert "widget 'f': replacing" in caplog.text and "module imported again" in caplog.text
    with pytest.raises(ValueError, match="already registered"):  # a different definition is still refused
        reg.register("f")(g)


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


def test_an_object_path_loads_the_object_on_demand(tmp_path, monkeypatch):
    """``pkg.module:Name`` (or ``file.py:Name``) works wherever a name does: the module is imported
    when the name is looked up; an object registered in it brings its entry's metadata."""
    (tmp_path / "widgets_ext.py").write_text(
        "from tests_registry_target import REG\n"
        "@REG.register('star', needs_critic=True)\n"
        "def star():\n    return 'star'\n"
        "def plain():\n    return 'plain'\n"
        "class Box:\n    class Inner:\n        pass\n"
        "NOT_CALLABLE = 3\n")
    reg = Registry("widget", Needs)
    target = type(sys)("tests_registry_target")
    target.REG = reg
    monkeypatch.setitem(sys.modules, "tests_registry_target", target)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "widgets_ext:plain" not in reg and reg.names() == []  # a path is not a registered name
    assert reg["widgets_ext:plain"]() == "plain" and reg.metadata("widgets_ext:plain") == Needs()
    assert reg.names() == ["star"]  # importing the module registered its entry
    assert reg.get("widgets_ext:star") is reg["star"] and reg.metadata("widgets_ext:star") == Needs(needs_critic=True)
    assert reg[f"{tmp_path / 'widgets_ext.py'}:plain"] is reg["widgets_ext:plain"]  # the file is that module
    assert reg["widgets_ext:Box.Inner"].__qualname__ == "Box.Inner"
    assert reg.has("widgets_ext:plain") and not reg.has("widgets_ext:missing") and not reg.has("nope")
    with pytest.raises(RegistryKeyError, match=r"'widgets_ext' has no 'missing'; it defines: Box, NOT_CALLABLE"):
        reg["widgets_ext:missing"]
    with pytest.raises(RegistryKeyError, match=r"'widgets_ext:NOT_CALLABLE' is not a widget: 3 \(a int\) is not a function or class"):
        reg["widgets_ext:NOT_CALLABLE"]
    with pytest.raises(RegistryKeyError, match=r"cannot load the widget 'no_such_module:f'.*No module named"):
        reg["no_such_module:f"]
    assert reg.get("no_such_module:f", None) is None
