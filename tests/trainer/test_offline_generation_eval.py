"""``rlvr.trainer.main_generation_server`` writes ``n`` responses per prompt row (greedy ones equal
transformers' own greedy decoding) and ``rlvr.trainer.main_eval`` scores such a file per data source
as verl does (hand-computed means), with bad rows and failing scorers named."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlvr.trainer.data import read_rows, write_rows
from rlvr.trainer.main_eval import main as eval_main
from rlvr.trainer.main_generation_server import main as generation_main
from rlvr.utils.testing import save_tiny_model, tiny_tokenizer

PROMPTS = [
    {"data_source": "tiny", "prompt": [{"role": "user", "content": "say 1"}], "reward_model": {"ground_truth": "1"},
     "extra_info": {"index": 0}},
    {"data_source": "other", "prompt": [{"role": "user", "content": "count to 3"}],
     "reward_model": {"ground_truth": "3"}, "extra_info": {"index": 1}},
    {"prompt": [{"role": "user", "content": "no answer key here"}]},  # generation needs the prompt only
]
GENERATION = ["data.max_prompt_length=64", "data.max_response_length=6", "data.train_batch_size=2",
              "trainer.backend=local", "trainer.device=cpu", "trainer.num_threads=1", "trainer.call_timeout_s=300"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


def test_n_samples_per_prompt_keep_the_rows(model_dir, tmp_path):
    write_rows(PROMPTS, tmp_path / "prompts.parquet")
    assert generation_main([f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={tmp_path / 'prompts.parquet'}",
                            f"data.output_path={tmp_path / 'out.parquet'}", "actor_rollout_ref.rollout.n=3",
                            "actor_rollout_ref.rollout.temperature=1.0", *GENERATION]) == 0
    rows = read_rows(tmp_path / "out.parquet")
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in PROMPTS]
    assert rows[0]["reward_model"] == {"ground_truth": "1"} and rows[2]["data_source"] is None
    assert all(len(r["responses"]) == 3 and all(isinstance(x, str) for x in r["responses"]) for r in rows)
    assert len({tuple(r["responses"]) for r in rows}) == 3  # sampled: the rows' responses differ


def test_greedy_responses_are_transformers_greedy(model_dir, tmp_path):
    write_rows(PROMPTS, tmp_path / "prompts.jsonl")
    assert generation_main([f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={tmp_path / 'prompts.jsonl'}",
                            f"data.output_path={tmp_path / 'out.parquet'}", "actor_rollout_ref.rollout.n=1",
                            "actor_rollout_ref.rollout.temperature=0", *GENERATION,
                            "actor_rollout_ref.rollout.response_length=5"]) == 0  # verl's length key
    tokenizer, model = tiny_tokenizer(), AutoModelForCausalLM.from_pretrained(model_dir)
    for row in read_rows(tmp_path / "out.parquet"):
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        assert row["responses"] == [tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)]


def test_generation_config_errors(model_dir, tmp_path, capsys):
    write_rows(PROMPTS, tmp_path / "prompts.parquet")
    base = [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={tmp_path / 'prompts.parquet'}", *GENERATION]
    assert generation_main([*base, f"data.output_path={tmp_path / 'out.parquet'}", "actor_rollout_ref.rollout.n=4",
                            "actor_rollout_ref.rollout.temperature=0"]) == 2
    assert "'actor_rollout_ref.rollout.n': greedy decoding" in capsys.readouterr().err
    assert generation_main(base) == 2
    assert "'data.output_path': None" in capsys.readouterr().err
    assert generation_main([*base, f"data.output_path={tmp_path / 'out.parquet'}", "data.max_prompt_length=8"]) == 2
    assert "prompts.parquet, row 0: the prompt has" in capsys.readouterr().err


REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "skip":
        return None
    if solution_str == "boom":
        raise ValueError("cannot score boom")
    return {"score": float(solution_str == ground_truth), "extra": 1}
'''


def scored_file(tmp_path, rows) -> str:
    path = tmp_path / "generated.parquet"
    write_rows(rows, path)
    return str(path)


def test_scores_are_means_per_row_then_per_source(tmp_path, capsys):
    (tmp_path / "reward.py").write_text(REWARD)
    rows = [{"data_source": "a", "responses": ["x", "y", "x", "skip"], "reward_model": {"ground_truth": "x"}},
            {"data_source": "a", "responses": ["z", "z"], "reward_model": {"ground_truth": "x"}},
            {"data_source": "b", "responses": ["q"], "reward_model": {"ground_truth": "q"}}]
    path = scored_file(tmp_path, rows)
    args = [f"data.path={path}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
            "ray_kwargs.ray_init.num_cpus=2", f"data.output_path={tmp_path / 'metrics.json'}"]
    assert eval_main(args) == 0
    # row means: (1 + 0 + 1) / 3 (the declined one left out), 0, 1; source a: (2/3 + 0) / 2
    expected = {"test_score/a": (2 / 3 + 0) / 2, "test_score/b": 1.0}
    assert json.loads((tmp_path / "metrics.json").read_text()) == pytest.approx(expected)
    assert str(expected["test_score/b"]) in capsys.readouterr().out


def test_rlvr_scorers_by_data_source(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "responses": ["so #### 72", "#### 71"], "reward_model": {"ground_truth": "72"}},
            {"data_source": "openai/gsm8k", "responses": ["#### 5"], "reward_model": {"ground_truth": "5"}}]
    assert eval_main([f"data.path={scored_file(tmp_path, rows)}", f"data.output_path={tmp_path / 'm.json'}"]) == 0
    assert json.loads((tmp_path / "m.json").read_text()) == {"test_score/openai/gsm8k": 0.75}


def test_bad_rows_and_failing_scorers_are_named(tmp_path, capsys):
    (tmp_path / "reward.py").write_text(REWARD)
    custom = f"custom_reward_function.path={tmp_path / 'reward.py'}"
    path = scored_file(tmp_path, [{"data_source": "a", "responses": ["x"], "reward_model": {"ground_truth": "x"}},
                                  {"data_source": "a", "responses": ["boom"], "reward_model": {"ground_truth": "x"}}])
    assert eval_main([f"data.path={path}", custom]) == 1
    assert f"{path}, row 1: scoring response 0 (data source 'a') failed (error): ValueError: cannot score boom" \
        in capsys.readouterr().err
    path = scored_file(tmp_path, [{"data_source": "a", "responses": ["x"], "reward_model": {"style": "rule"}}])
    assert eval_main([f"data.path={path}", custom]) == 2
    assert f"{path}, row 0: field 'reward_model' must be a dict with a ground_truth" in capsys.readouterr().err
    path = scored_file(tmp_path, [{"data_source": "unheard/of", "responses": ["x"], "reward_model": {"ground_truth": "x"}}])
    assert eval_main([f"data.path={path}"]) == 1
    assert "row 0: scoring response 0 (data source 'unheard/of') failed (unknown)" in capsys.readouterr().err
    assert eval_main([f"data.path={path}", "ray_kwargs.timeline_json_file=t.json"]) == 2
