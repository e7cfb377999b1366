"""``@register`` records its settings and rejects malformed dispatch modes."""

from __future__ import annotations

import pytest

from rlvr.single_controller import ClassWithInitArgs, Dispatch, Execute, Worker, register
from rlvr.single_controller.base.decorator import RegisterSpec, registered_methods, resolve_dispatch


class _Plain(Worker):
    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute(self, data):
        return data

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def report(self):
        return self.rank

    def helper(self):
        return 1


def test_register_records_settings_and_keeps_the_method_callable(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # a rank-0 worker would pick one otherwise
    monkeypatch.setenv("MASTER_PORT", "29500")
    methods = registered_methods(_Plain)
    assert set(methods) == {
        "compute", "report", "init_process_group", "execute_with_func_generator", "execute_func_rank_zero",
        "_query_dispatch_info", "_query_collect_info",  # the base Worker's (verl's nd dispatch)
    }
    assert methods["compute"] == RegisterSpec(Dispatch.DP_MP_COMPUTE, Execute.ALL, True, True, False)
    assert methods["report"].execute_mode is Execute.RANK_ZERO  # RANK_ZERO dispatch runs on rank 0 only
    assert methods["init_process_group"].dispatch_mode is Dispatch.ONE_TO_ALL
    worker = _Plain()
    assert worker.compute(7) == 7 and worker.report() == 0 and _Plain.compute.__name__ == "compute"


def test_malformed_dispatch_modes_are_rejected():
    """The messages contain verl's words (verl asserts, so the errors are AssertionErrors too)."""
    with pytest.raises(TypeError, match="key collect_fn should be in dispatch_mode if it is a dictionary"):
        register(dispatch_mode={"dispatch_fn": print})
    with pytest.raises(AssertionError, match="dispatch_mode must be a Dispatch or a Dict. Got 'one_to_all'"):
        register(dispatch_mode="one_to_all")
    with pytest.raises(TypeError, match="execute_mode must be a Execute"):
        register(execute_mode="all")
    with pytest.raises(TypeError, match="dispatch_fn and collect_fn must be callables"):
        register(dispatch_mode={"dispatch_fn": print, "collect_fn": 3})
    assert resolve_dispatch({"dispatch_fn": print, "collect_fn": len}) == (print, len)


def test_check_dispatch_mode_is_verls_check_in_the_decorator_module():
    """verl's code imports ``_check_dispatch_mode`` / ``_check_execute_mode`` from the decorator
    module (its transfer-queue helpers validate a mode before they wrap a method)."""
    from rlvr.single_controller.base.decorator import _check_dispatch_mode, _check_execute_mode

    assert _check_dispatch_mode(Dispatch.DP_COMPUTE_PROTO) is None
    assert _check_dispatch_mode({"dispatch_fn": print, "collect_fn": len}) is None
    for bad, message in ((Execute.ALL, "must be a Dispatch or a Dict"),
                         ({"collect_fn": len}, "key dispatch_fn should be in dispatch_mode")):
        with pytest.raises(AssertionError, match=message):
            _check_dispatch_mode(bad)
    assert _check_execute_mode(Execute.RANK_ZERO) is None
    with pytest.raises(AssertionError, match="execute_mode must be a Execute. Got 'all'"):
        _check_execute_mode("all")


def test_worker_reads_its_place_from_the_environment(monkeypatch):
    for key, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    worker = Worker(worker_config={"lr": 1.0})
    assert (worker.rank, worker.world_size, worker.local_rank) == (3, 4, 1)
    assert (worker.master_addr, worker.master_port) == ("10.0.0.1", 29500)
    assert worker.worker_config == {"lr": 1.0} and worker.device == "cpu"
    info = worker.rank_info
    assert (info.rank, info.world_size, info.dp_rank, info.dp_size, info.tp_rank, info.tp_size) == (3, 4, 3, 4, 0, 1)
    assert info.is_collect


class _Clashing(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def spawn(self):
        return None


def test_a_method_named_like_a_group_attribute_is_rejected(make_group):
    with pytest.raises(TypeError, match="may not be called 'spawn'"):
        make_group("local", ClassWithInitArgs(_Clashing))
