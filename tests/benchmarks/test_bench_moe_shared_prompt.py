"""``benchmarks/bench_moe_shared_prompt.py`` on a one-layer random Mixtral of SmolLM2's widths: both
settings run the MoE job's update on one batch, the shared-prompt forward's loss equals the plain
one's, and no micro-batch falls back (the rows of a prompt carry that prompt's routes)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_moe_shared_prompt


@pytest.mark.slow  # four AdamW updates of a 40M-parameter model: about 14 s
def test_the_shared_and_plain_updates_of_the_moe_job_give_the_same_loss(tmp_path):
    out = tmp_path / "shared.json"
    bench_moe_shared_prompt.main(["--random-layers", "1", "--prompt-len", "6", "--response-len", "4", "--repeats", "1",
                                  "--threads", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["prompts"] * result["responses_per_prompt"] == 32 and result["model"] == "random Mixtral, 1 layers"
    assert result["shared_pg_loss"] == pytest.approx(result["plain_pg_loss"], abs=1e-5)
    assert result["shared_fallbacks"] == result["plain_fallbacks"] == 0
    assert len(result["plain"]) == len(result["shared"]) == 1 and result["speedup"] > 0
