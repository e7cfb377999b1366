"""verl 0.9 client code for the registries, with only the import renamed: verl's tests replace
``core_algos.ADV_ESTIMATOR_REGISTRY`` with a plain dict and expect ``register_adv_est`` /
``get_adv_estimator_fn`` to use it, register the same function twice, register under a member of
their own ``Enum``, and match verl's messages; the reward-manager registry is cleared and filled
with strings. Written from verl's documented behaviour; every test puts the real registries back."""

from __future__ import annotations

from enum import Enum

import pytest

import rlvr.trainer.ppo.core_algos as core_algos
from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY
from rlvr.trainer.ppo.policy_loss import POLICY_LOSS_REGISTRY
from rlvr.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register


def one_estimator():
    return "one"


@pytest.fixture
def replaced_estimators(monkeypatch):
    """verl's set-up: the module's registry replaced by a dict of two entries."""
    table = {"gae": lambda x: x * 2, "vtrace": lambda x: x + 1}
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", table)
    return table


def test_register_and_get_use_the_dict_that_replaced_the_registry(replaced_estimators):
    @core_algos.register_adv_est("test_estimator")
    def test_fn():
        return "original"

    assert replaced_estimators["test_estimator"] is test_fn and test_fn() == "original"
    assert "test_estimator" not in ADV_ESTIMATOR_REGISTRY  # the real registry is left alone
    assert core_algos.get_adv_estimator_fn("gae")(5) == 10 and core_algos.get_adv_estimator_fn("vtrace")(5) == 6
    before = len(replaced_estimators)
    core_algos.register_adv_est("estimator1")(lambda: 1)
    core_algos.register_adv_est("estimator2")(lambda: 2)
    assert len(replaced_estimators) == before + 2


def test_an_enum_of_the_users_own_names_the_estimator(replaced_estimators):
    class MyEstimators(Enum):
        TEST = "test_enum_estimator"

    fn = core_algos.register_adv_est(MyEstimators.TEST)(one_estimator)
    assert replaced_estimators["test_enum_estimator"] is fn
    assert core_algos.get_adv_estimator_fn(MyEstimators.TEST) is fn


def test_the_same_function_twice_is_accepted_another_one_is_not(replaced_estimators):
    core_algos.register_adv_est("duplicate_test")(one_estimator)
    core_algos.register_adv_est("duplicate_test")(one_estimator)
    assert replaced_estimators["duplicate_test"] is one_estimator

    @core_algos.register_adv_est("conflict_test")
    def first():
        pass

    with pytest.raises(ValueError, match="advantage estimator 'conflict_test' is already registered"):

        @core_algos.register_adv_est("conflict_test")
        def second():
            pass


def test_a_miss_has_verls_message_and_is_case_sensitive(replaced_estimators):
    with pytest.raises(ValueError) as info:
        core_algos.get_adv_estimator_fn("invalid_name")
    assert "Unknown advantage estimator simply: invalid_name" in str(info.value)
    assert "valid names: gae, vtrace" in str(info.value)  # rlvr's part: what to write instead
    with pytest.raises(ValueError):
        core_algos.get_adv_estimator_fn("GAE")


def test_the_real_registries_behave_the_same(monkeypatch):
    """Without a replacement: the registries themselves, with verl's messages in the misses."""
    monkeypatch.setattr(ADV_ESTIMATOR_REGISTRY, "_metadata", dict(ADV_ESTIMATOR_REGISTRY._metadata))

    class Names(Enum):
        MINE = "verl_compat_mine"

    try:
        fn = core_algos.register_adv_est(Names.MINE)(one_estimator)
        assert core_algos.register_adv_est(Names.MINE)(one_estimator) is fn  # again: no error
        assert core_algos.get_adv_estimator_fn("verl_compat_mine") is fn
        with pytest.raises(ValueError, match="Unknown advantage estimator simply: nope"):
            core_algos.get_adv_estimator_fn("nope")
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("verl_compat_mine", None)
    with pytest.raises(ValueError, match=r"valid names: bypass_mode, cispo.*Unsupported loss mode: nope"):
        core_algos.get_policy_loss_fn("nope")
    assert core_algos.get_policy_loss_fn("vanilla") is POLICY_LOSS_REGISTRY["vanilla"]


@pytest.fixture
def manager_registry():
    """verl's set-up: the reward-manager registry cleared and filled with two strings; the real
    entries come back afterwards."""
    saved, saved_metadata = dict(REWARD_MANAGER_REGISTRY), dict(REWARD_MANAGER_REGISTRY._metadata)
    REWARD_MANAGER_REGISTRY.clear()
    REWARD_MANAGER_REGISTRY.update({"manager1": "Manager1Class", "manager2": "Manager2Class"})
    yield REWARD_MANAGER_REGISTRY
    REWARD_MANAGER_REGISTRY.clear()
    REWARD_MANAGER_REGISTRY.update(saved)
    REWARD_MANAGER_REGISTRY._metadata.clear()
    REWARD_MANAGER_REGISTRY._metadata.update(saved_metadata)


def test_reward_manager_lookups_and_verls_messages(manager_registry):
    assert get_reward_manager_cls("manager1") == "Manager1Class"
    assert get_reward_manager_cls("manager2") == "Manager2Class"
    with pytest.raises(ValueError) as info:
        get_reward_manager_cls("unknown_manager")
    assert "Unknown reward manager: unknown_manager" in str(info.value)
    for wrong_case in ("MANAGER1", "Manager1"):
        with pytest.raises(ValueError):
            get_reward_manager_cls(wrong_case)
    manager_registry.clear()
    with pytest.raises(ValueError, match="Unknown reward manager: any_manager"):
        get_reward_manager_cls("any_manager")


def test_reward_manager_registration(manager_registry):
    @register("test_manager")
    class TestManager:
        def method(self):
            return 42

    assert manager_registry["test_manager"] is TestManager and TestManager().method() == 42
    assert register("test_manager")(TestManager) is TestManager  # the same class again: idempotent

    @register("conflict_manager")
    class Manager1:
        pass

    with pytest.raises(ValueError, match="reward manager 'conflict_manager' is already registered"):

        @register("conflict_manager")
        class Manager2:
            pass

    assert manager_registry["conflict_manager"] is Manager1
