"""benchmarks/profile_decode.py on the tiny workload (CPU, a few tokens)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.profile_decode import SPLIT, TOP, main
from rlvr.workers.rollout import HFRollout, hf_rollout, static_decode


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_profile_of_a_tiny_decode_writes_a_sane_summary(tmp_path, static):
    out = tmp_path / "profile.json"
    argv = ["--size", "tiny", "--device", "cpu", "--prompts", "2", "--samples", "2", "--response-len", "6",
            "--no-compile", "--json", str(out), "--trace", str(tmp_path / "trace.json")] + ["--static-cache"] * static
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert "profile_error" not in result
    assert result["rows"] == 4 and result["compile"] is False and result["eos_check"] is True
    assert result["static_cache"] is static
    assert result["decode_steps"] == 5  # random weights: no EOS, one decoder step per token after the first
    assert result["stop_check_every"] == 1
    assert 0 < result["prefill_s"] < result["wall_s"]
    assert result["ms_per_step"] == pytest.approx(result["decode_s"] / 5 * 1e3)
    assert result["read_floor_s"] > 0 and result["decode_over_floor"] == pytest.approx(
        result["decode_s"] / result["read_floor_s"])
    assert result["launches_per_step"]["aten_ops_per_step"] > 50  # a 2-layer model step plus sampling
    assert result["syncs"]["read_backs"] >= 5  # at least the stop check of every step
    assert len(result["top_ops"]) == TOP
    assert all(op["count"] >= 1 and op["total_ms"] > 0 for op in result["top_ops"])
    assert [op["total_ms"] for op in result["top_ops"]] == sorted((op["total_ms"] for op in result["top_ops"]),
                                                                  reverse=True)
    split = result["split"]
    assert set(split) == set(SPLIT)
    assert split["first_token"]["calls"] == 1 and split["draw"]["calls"] == 5 and split["step"]["calls"] == 5
    assert split["model"]["calls"] == 5 and split["sampling"]["calls"] == 5 and split["stop_check"]["calls"] == 5  # none after the last token
    assert split["step"]["host_ms_per_step"] >= split["model"]["host_ms_per_step"] + \
        split["sampling"]["host_ms_per_step"] * 0.99
    assert (tmp_path / "trace.json").stat().st_size > 0
    # the labels are gone afterwards
    assert hf_rollout.sample_tokens.__module__ == "rlvr.workers.rollout.sampling"
    assert static_decode.sample_with_uniform.__module__ == "rlvr.workers.rollout.sampling"
    assert "_all_stopped" not in vars(HFRollout) or isinstance(vars(HFRollout)["_all_stopped"], staticmethod)
    assert torch.is_grad_enabled()


def test_a_failed_profile_keeps_the_timings(tmp_path, monkeypatch):
    import benchmarks.profile_decode as profile_decode

    def broken(*args, **kwargs):
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(profile_decode, "summarise", broken)
    out = tmp_path / "profile.json"
    assert main(["--size", "tiny", "--device", "cpu", "--prompts", "1", "--samples", "2", "--response-len", "3",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["profile_error"] == "RuntimeError: no profiler here"
    assert result["decode_steps"] == 2 and result["ms_per_step"] > 0 and "top_ops" not in result
