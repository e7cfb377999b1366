"""The RL dataset with images in verl's format: the processor's chat template, image tokens, the image
inputs of each row, over-long prompts and unreadable images."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from mm_helpers import QUESTION, make_config, picture, write_image_rows

from rlvr.trainer.data import RLHFDataset, collate_fn, write_rows
from rlvr.utils.errors import DataError
from rlvr.utils.multimodal import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from rlvr.utils.tokenizer import hf_processor, hf_tokenizer


def dataset(model_dir, path, *overrides):
    config = make_config(model_dir, *overrides).data
    return RLHFDataset(str(path), hf_tokenizer(model_dir), config, processor=hf_processor(model_dir))


def encoded(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_items_hold_the_processor_output_of_each_row(vl_dirs, image_data):
    processor = hf_processor(vl_dirs["qwen2_5_vl"])
    ds = dataset(vl_dirs["qwen2_5_vl"], image_data)
    image_token = processor.image_token_id
    lengths = []
    for i in range(len(ds)):
        item = ds[i]
        text = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this?"}]}],
            add_generation_prompt=True, tokenize=False)
        direct = processor(text=[text], images=[item[MULTI_MODAL_DATA]["image"][0]], return_tensors="pt")
        real = item["attention_mask"].bool()
        assert item["input_ids"][real].tolist() == direct["input_ids"][0].tolist()
        inputs = item[MULTI_MODAL_INPUTS]
        assert sorted(inputs) == ["image_grid_thw", "pixel_values"]
        assert torch.equal(inputs["pixel_values"], direct["pixel_values"])
        assert int((item["input_ids"] == image_token).sum()) == int(inputs["image_grid_thw"].prod()) // 4
        assert item["raw_prompt"] == [{"role": "user", "content": QUESTION}]
        lengths.append(int(real.sum()))
    assert lengths == [20, 22, 20, 22]  # 56x56: 4 image tokens, 84x56: 6
    assert ds.prompt_length == 22
    batch = collate_fn([ds[i] for i in range(len(ds))])
    assert batch["input_ids"].shape == (4, 22) and batch[MULTI_MODAL_INPUTS].shape == (4,)


def test_base64_in_jsonl_and_bytes_in_parquet_read_like_paths(vl_dirs, image_data, tmp_path):
    model = vl_dirs["qwen2_vl"]
    by_path = dataset(model, image_data)
    rows = [json.loads(line) for line in image_data.read_text().splitlines()]
    images = [picture_file(image_data.parent / row["images"][0]) for row in rows]
    write_rows([{**row, "images": [encoded(image)]} for row, image in zip(rows, images)], tmp_path / "b64.jsonl")
    write_rows([{**row, "images": [{"bytes": png(image)}]} for row, image in zip(rows, images)], tmp_path / "b.parquet")
    for other in (dataset(model, tmp_path / "b64.jsonl"), dataset(model, tmp_path / "b.parquet")):
        for i in range(len(rows)):
            assert torch.equal(other[i]["input_ids"], by_path[i]["input_ids"])
            assert torch.equal(other[i][MULTI_MODAL_INPUTS]["pixel_values"], by_path[i][MULTI_MODAL_INPUTS]["pixel_values"])


def picture_file(path):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_rows_without_images_get_empty_image_fields(vl_dirs, tmp_path):
    path = write_image_rows(tmp_path, count=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows.append({"data_source": "colours", "prompt": [{"role": "user", "content": "No image here."}],
                 "reward_model": {"ground_truth": "none"}})
    write_rows(rows, tmp_path / "mixed.jsonl")
    ds = dataset(vl_dirs["qwen2_vl"], tmp_path / "mixed.jsonl")
    assert ds[2][MULTI_MODAL_INPUTS] == {} and ds[2][MULTI_MODAL_DATA] == {}
    assert ds[0][MULTI_MODAL_DATA]["image"][0].size == (56, 56)


def test_image_tokens_count_in_the_prompt_length(vl_dirs, image_data):
    ds = dataset(vl_dirs["qwen2_vl"], image_data, "data.max_prompt_length=21")  # the 84x56 rows have 22
    assert (len(ds), ds.num_filtered) == (2, 2)
    with pytest.raises(DataError, match="all 4 prompts are longer"):
        dataset(vl_dirs["qwen2_vl"], image_data, "data.max_prompt_length=10")


def test_truncation_may_cut_text_but_never_an_image(vl_dirs, tmp_path):
    picture((9, 9, 9)).save(tmp_path / "p.png")
    row = {"data_source": "colours", "images": ["p.png"], "reward_model": {"ground_truth": "x"},
           "prompt": [{"role": "user", "content": "<image>" + " and then" * 10}]}
    write_rows([row], tmp_path / "long.jsonl")
    cut = ["data.max_prompt_length=16", "data.filter_overlong_prompts=false"]
    kept = dataset(vl_dirs["qwen2_vl"], tmp_path / "long.jsonl", *cut, "data.truncation=right")
    assert kept.prompt_length == 16
    assert int((kept[0]["input_ids"] == hf_processor(vl_dirs["qwen2_vl"]).image_token_id).sum()) == 4
    assert kept[0][MULTI_MODAL_INPUTS]["pixel_values"].shape == (16, 1176)
    with pytest.raises(DataError, match=r"long.jsonl, line 1: .*would cut into an image"):
        dataset(vl_dirs["qwen2_vl"], tmp_path / "long.jsonl", *cut, "data.truncation=left")


def test_an_unreadable_image_names_file_row_and_field(vl_dirs, image_data, tmp_path):
    rows = [json.loads(line) for line in image_data.read_text().splitlines()]
    rows[2]["images"] = [rows[2]["images"][0], "gone.png"]
    rows[2]["prompt"] = [{"role": "user", "content": "<image><image>Which differ?"}]
    (tmp_path / "img0.png").write_bytes((image_data.parent / "img0.png").read_bytes())
    for i in (0, 1, 3):
        (tmp_path / f"img{i}.png").write_bytes((image_data.parent / f"img{i}.png").read_bytes())
    (tmp_path / "img2.png").write_bytes(b"garbage")
    write_rows(rows, tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=r"bad.jsonl, line 3: field 'images\[0\]': the file .*img2.png is not a readable"):
        dataset(vl_dirs["qwen2_vl"], tmp_path / "bad.jsonl")
    rows[2]["images"] = ["img0.png", "gone.png"]
    write_rows(rows, tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=r"bad.jsonl, line 3: field 'images\[1\]': the image file .*gone.png does not"):
        dataset(vl_dirs["qwen2_vl"], tmp_path / "bad.jsonl")


def test_placeholders_must_match_the_images(vl_dirs, image_data, tmp_path):
    rows = [json.loads(line) for line in image_data.read_text().splitlines()]
    rows[1]["prompt"] = [{"role": "user", "content": "What colour is this?"}]
    write_rows(rows, image_data.parent / "no_placeholder.jsonl")
    with pytest.raises(DataError, match=r"line 2: field 'prompt' has 0 <image> placeholder\(s\) but field 'images' "
                                        r"holds 1 image"):
        dataset(vl_dirs["qwen2_vl"], image_data.parent / "no_placeholder.jsonl")


def test_the_image_column_is_data_image_key(vl_dirs, image_data):
    rows = [json.loads(line) for line in image_data.read_text().splitlines()]
    write_rows([{**{k: v for k, v in row.items() if k != "images"}, "pictures": row["images"]} for row in rows],
               image_data.parent / "pictures.jsonl")
    ds = dataset(vl_dirs["qwen2_vl"], image_data.parent / "pictures.jsonl", "data.image_key=pictures")
    assert ds[0][MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_geometry3k_records_become_image_rows(vl_dirs, tmp_path):
    from rlvr.data_prep.geo3k import DATA_SOURCE, _local, to_rows
    from rlvr.reward.scorers import default_compute_score

    diagram = picture((250, 250, 250), mark=1)
    records = [{"images": [diagram], "problem": "<image>Find x.", "answer": "3"},
               {"images": [{"bytes": png(diagram), "path": None}], "problem": "Find y.", "answer": "\\frac{1}{2}"}]
    rows = to_rows(records, "train")
    assert rows[0]["prompt"][0]["content"].startswith("<image>Find x. You FIRST think")
    assert rows[1]["prompt"][0]["content"].startswith("<image>Find y.")
    assert rows[1]["images"][0]["bytes"][:4] == b"\x89PNG" and rows[0]["data_source"] == DATA_SOURCE
    hub_layout = tmp_path / "geometry3k" / "data" / "train-00000-of-00001.parquet"  # a downloaded copy
    write_rows([{"images": [{"bytes": png(diagram), "path": None}], "problem": "Find z.", "answer": "4"}], hub_layout)
    assert [r["problem"] for r in _local(tmp_path / "geometry3k", "train")] == ["Find z."]
    write_rows(rows, tmp_path / "train.parquet")
    ds = dataset(vl_dirs["qwen2_vl"], tmp_path / "train.parquet", "data.max_prompt_length=128")
    assert ds[1][MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert default_compute_score(DATA_SOURCE, "<think>...</think> \\boxed{0.5}", "\\frac{1}{2}")["acc"] == 1.0


def test_mm_processor_kwargs_reach_the_processor(vl_dirs, image_data):
    """verl's data.mm_processor_kwargs: under a pixel budget of 56x56 the processor resizes the 84x56
    images (its rounding gives them 2 image tokens instead of 6); the 56x56 ones keep their 4."""
    plain = dataset(vl_dirs["qwen2_vl"], image_data)
    capped = dataset(vl_dirs["qwen2_vl"], image_data, "data.mm_processor_kwargs.max_pixels=3136")
    token = hf_processor(vl_dirs["qwen2_vl"]).image_token_id
    counts = [[int((ds[i]["input_ids"] == token).sum()) for i in range(len(ds))] for ds in (plain, capped)]
    assert counts == [[4, 6, 4, 6], [4, 2, 4, 2]]
