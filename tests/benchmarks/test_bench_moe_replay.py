"""The routing-replay benchmark on a saved MoE with chat prompts from a JSONL file (``--model``, ``--data``):
the MoE job's measurement, here on a tiny saved Mixtral."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_moe_replay import main
from rlvr.utils.tiny_moe import save_tiny_moe


def test_a_saved_model_with_chat_prompts(tmp_path):
    model = save_tiny_moe(tmp_path / "model", "mixtral")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"add {i} and {i + 1}"}]}) + "\n"
                            for i in range(5)))
    out = tmp_path / "result.json"
    main(["--model", str(model), "--data", str(data), "--prompts", "3", "--samples", "2", "--response-len", "6",
          "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["model"] == {"path": str(model), "arch": "mixtral", "layers": 2, "experts": 8, "top_k": 2,
                               "data": str(data)}
    assert result["rows"] == 6 and 0 < result["compared_tokens"] <= result["response_tokens"] <= 36
    assert 0 <= result["topk_differs"] <= result["tokens_any_layer_differs"] <= 1
    # R3 sends every token to the rollout's experts: the gap left is the bf16 arithmetic alone
    assert 0 < result["dlogp_after"]["max"] <= result["dlogp_before"]["max"] + 1e-6
    assert result["dlogp_after"]["mean"] == pytest.approx(result["dlogp_before"]["mean"], rel=0.5)
