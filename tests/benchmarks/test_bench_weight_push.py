"""The weight-push benchmark on a CPU: a tiny model pushed twice to a fresh rollout process through
shared memory, the child's copies bit-identical, the sizes and rates consistent."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_weight_push import main, parse_args


def test_two_pushes_of_the_tiny_model_reach_the_child_bit_identical(tmp_path):
    out = tmp_path / "push.json"
    assert main(["--size", "tiny", "--repeats", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # by hand: embedding 49152 x 64, twice in the state dict (the tied head); per layer q, o 64x64, k, v 64x32,
    # gate, up, down 64x256 and two norms of 64; the final norm: 6,414,656 fp32 values
    assert result["bytes"] == 4 * (2 * 49152 * 64 + 2 * (2 * 4096 + 2 * 2048 + 3 * 16384 + 128) + 64) == 25658624
    assert result["path"] == "shared memory" and result["all_bit_identical"]
    assert [p["version"] for p in result["pushes"]] == [1, 2]
    for push in result["pushes"]:
        assert 0 < push["blocking_s"] <= push["confirm_s"]
        assert push["gb_per_s"] == pytest.approx(push["bytes"] / push["confirm_s"] / 1e9)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--size", "huge"])
