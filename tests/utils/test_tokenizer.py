"""Tests of rlvr.utils.tokenizer."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlvr.utils.testing import save_tiny_model
from rlvr.utils.tokenizer import hf_processor, hf_tokenizer


def save_word_tokenizer(path, **special):
    """A word-level tokenizer whose token i is ``w{i}`` and token 107 is ``<end_of_turn>``."""
    vocab = {f"w{i}": i for i in range(110)}
    vocab["<end_of_turn>"] = 107
    del vocab["w107"]
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, **special).save_pretrained(path)
    return path


def test_loads_tiny_model_folder(tmp_path):
    tok = hf_tokenizer(save_tiny_model(tmp_path / "tiny"))
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 3)


def test_missing_pad_token_becomes_eos_with_warning(tmp_path):
    path = save_word_tokenizer(tmp_path / "nopad", eos_token="w2")
    with pytest.warns(UserWarning, match="pad_token_id is None"):
        tok = hf_tokenizer(path)
    assert tok.pad_token == "w2" and tok.pad_token_id == 2
    untouched = hf_tokenizer(path, correct_pad_token=False)
    assert untouched.pad_token_id is None


def test_gemma2_eos_correction(tmp_path):
    path = save_word_tokenizer(tmp_path / "google" / "gemma-2-2b-it", eos_token="w1", pad_token="w0")
    with pytest.warns(UserWarning, match="<end_of_turn>"):
        tok = hf_tokenizer(path)
    assert tok.eos_token == "<end_of_turn>" and tok.eos_token_id == 107
    plain = hf_tokenizer(path, correct_gemma2=False)
    assert plain.eos_token_id == 1


def test_hf_processor_is_none_for_text_only_model(tmp_path):
    assert hf_processor(save_tiny_model(tmp_path / "tiny")) is None
