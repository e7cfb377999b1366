"""verl's data keys, each with its effect: return_raw_chat, train_max_samples (a seeded random subset),
val_max_samples=-1, custom_cls, filter_overlong_prompts_workers (the same ids from worker processes),
apply_chat_template_kwargs, model.custom_chat_template, data.trust_remote_code, video/audio rows,
reward_fn_key."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
from trainer_helpers import write_tiny_dataset

from rlvr.protocol import DataProto
from rlvr.trainer.config import load_config
from rlvr.trainer.data import RLHFDataset, collate_fn, create_rl_dataset, read_rows, write_rows
from rlvr.utils.errors import ConfigError, DataError
from rlvr.utils.testing import tiny_tokenizer


def _data(*overrides: str):
    return load_config(None, ["data.max_prompt_length=40", *overrides]).data


def test_return_raw_chat_keeps_or_drops_the_messages(tmp_path):
    path = str(write_tiny_dataset(tmp_path / "d.jsonl", 4))
    kept = RLHFDataset(path, tiny_tokenizer(), _data())[0]
    assert kept["raw_prompt"] == [{"role": "user", "content": "say 0 0"}]
    dropped = RLHFDataset(path, tiny_tokenizer(), _data("data.return_raw_chat=false"))[0]
    assert "raw_prompt" not in dropped and torch.equal(dropped["input_ids"], kept["input_ids"])


def test_train_max_samples_is_a_seeded_random_subset_and_minus_one_is_all(tmp_path):
    path = str(write_tiny_dataset(tmp_path / "d.jsonl", 20))
    cfg = _data("data.train_max_samples=5", "data.seed=3")
    first = [row["extra_info"]["index"] for row in create_rl_dataset(path, cfg, tiny_tokenizer()).rows]
    again = [row["extra_info"]["index"] for row in create_rl_dataset(path, cfg, tiny_tokenizer()).rows]
    other = create_rl_dataset(path, _data("data.train_max_samples=5", "data.seed=4"), tiny_tokenizer()).rows
    assert first == again and len(first) == 5 and first == sorted(first) and first != list(range(5))
    assert first != [row["extra_info"]["index"] for row in other]
    assert len(create_rl_dataset(path, _data("data.train_max_samples=-1"), tiny_tokenizer())) == 20
    val = create_rl_dataset(path, _data(), tiny_tokenizer(), is_train=False, max_samples=-1)
    assert len(val) == 20
    assert [r["extra_info"]["index"] for r in create_rl_dataset(path, _data(), tiny_tokenizer(), is_train=False,
                                                                 max_samples=3).rows] == [0, 1, 2]


def test_custom_cls_builds_the_users_dataset(tmp_path):
    path = str(write_tiny_dataset(tmp_path / "d.jsonl", 4))
    module = tmp_path / "my_dataset.py"
    module.write_text(textwrap.dedent("""
        from torch.utils.data import Dataset

        class Doubled(Dataset):
            def __init__(self, data_files, tokenizer, processor, config, max_samples=None):
                from rlvr.trainer.data import RLHFDataset
                self.inner = RLHFDataset(data_files, tokenizer, config, processor)
                self.max_samples = max_samples

            def __len__(self):
                return 2 * len(self.inner)

            def __getitem__(self, index):
                return self.inner[index % len(self.inner)]
    """))
    cfg = _data(f"data.custom_cls.path={module}", "data.custom_cls.name=Doubled", "data.train_max_samples=3")
    dataset = create_rl_dataset([path], cfg, tiny_tokenizer())
    assert type(dataset).__name__ == "Doubled" and len(dataset) == 8 and dataset.max_samples == 3
    with pytest.raises(ConfigError, match="has no 'Missing'"):
        create_rl_dataset([path], _data(f"data.custom_cls.path={module}", "data.custom_cls.name=Missing"),
                          tiny_tokenizer())


class _PidTokenizer:
    """A tokenizer whose ids are the id of the process that tokenized (picklable: module level)."""

    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        return messages[-1]["content"]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [os.getpid(), len(text)]}


def test_filter_workers_tokenize_in_several_processes_with_the_same_result(tmp_path):
    path = str(write_tiny_dataset(tmp_path / "d.jsonl", 12))
    serial = RLHFDataset(path, _PidTokenizer(), _data())
    pooled = RLHFDataset(path, _PidTokenizer(), _data("data.filter_overlong_prompts_workers=2"))
    assert {ids[0] for ids in serial.prompt_ids} == {os.getpid()}
    pids = {ids[0] for ids in pooled.prompt_ids}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert [ids[1] for ids in pooled.prompt_ids] == [ids[1] for ids in serial.prompt_ids]
    tok = tiny_tokenizer()
    assert RLHFDataset(path, tok, _data("data.filter_overlong_prompts_workers=2")).prompt_ids == \
        RLHFDataset(path, tok, _data()).prompt_ids


def test_chat_template_kwargs_and_a_custom_chat_template(tmp_path, tiny_model_dir):
    from rlvr.utils.tokenizer import data_tokenizer

    path = str(write_tiny_dataset(tmp_path / "d.jsonl", 2))
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}{{ suffix }}"
    cfg = load_config(None, [f"actor_rollout_ref.model.path={tiny_model_dir}", "data.max_prompt_length=40",
                             f"actor_rollout_ref.model.custom_chat_template='{template}'",
                             "+data.apply_chat_template_kwargs.suffix=END"])
    tokenizer, processor = data_tokenizer(cfg.actor_rollout_ref.model, cfg.data)
    assert processor is None and tokenizer.chat_template == template
    dataset = RLHFDataset(path, tokenizer, cfg.data)
    assert tokenizer.decode(dataset.prompt_ids[0]) == "[say 0 0]END"


def test_data_trust_remote_code_lets_the_tokenizer_load_its_own_code(tmp_path, tiny_model_dir):
    """A tokenizer folder whose class is defined in the folder (auto_map) loads only with custom
    code allowed; verl's data.trust_remote_code allows it for the driver's tokenizer."""
    import json
    import shutil

    from rlvr.utils.tokenizer import data_tokenizer

    folder = tmp_path / "custom_tok"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "my_tokenizer.py").write_text(textwrap.dedent("""
        from transformers import PreTrainedTokenizerFast

        class MyTokenizer(PreTrainedTokenizerFast):
            pass
    """))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "my_tokenizer.MyTokenizer"]}
    config["tokenizer_class"] = "MyTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    base = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"actor_rollout_ref.model.tokenizer_path={folder}"]
    trusted = load_config(None, [*base, "data.trust_remote_code=true"])
    tokenizer, _ = data_tokenizer(trusted.actor_rollout_ref.model, trusted.data)
    assert type(tokenizer).__name__ == "MyTokenizer"
    untrusted = load_config(None, base)
    with pytest.raises(ValueError, match="trust_remote_code"):
        data_tokenizer(untrusted.actor_rollout_ref.model, untrusted.data)


def test_rows_with_videos_or_audio_are_refused(tmp_path):
    rows = read_rows(write_tiny_dataset(tmp_path / "d.jsonl", 3))
    rows[1]["videos"] = ["clip.mp4"]
    write_rows(rows, tmp_path / "v.jsonl")
    with pytest.raises(DataError, match=r"line 2 has videos in field 'videos'; rlvr trains on text and images"):
        RLHFDataset(str(tmp_path / "v.jsonl"), tiny_tokenizer(), _data())
    assert len(RLHFDataset(str(tmp_path / "v.jsonl"), tiny_tokenizer(), _data("data.video_key=clips"))) == 3


def test_reward_fn_key_names_the_data_source_column(tmp_path):
    from rlvr.trainer.ppo.reward import load_reward_manager

    seen = tmp_path / "seen.txt"
    module = tmp_path / "score.py"
    module.write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      f"    open({str(seen)!r}, 'a').write(data_source + '\\n')\n    return 1.0\n")
    cfg = load_config(None, [f"custom_reward_function.path={module}", "data.reward_fn_key=origin"])
    tok = tiny_tokenizer()
    batch = collate_fn([RLHFDataset(str(write_tiny_dataset(tmp_path / "d.jsonl", 2)), tok, _data())[i]
                        for i in range(2)])
    data = DataProto.from_single_dict({**batch, "origin": batch["data_source"].copy()})
    data.non_tensor_batch["origin"][:] = ["from_origin_a", "from_origin_b"]
    data.batch["prompts"] = data.batch["input_ids"]
    data.batch["responses"] = torch.tensor([[5, 6], [7, 8]])
    data.batch["attention_mask"] = torch.cat([data.batch["attention_mask"], torch.ones(2, 2, dtype=torch.long)], 1)
    data.batch["response_mask"] = torch.ones(2, 2, dtype=torch.long)
    load_reward_manager(cfg, tok, num_examine=0)(data)
    assert seen.read_text().split() == ["from_origin_a", "from_origin_b"]
