"""Tests of rlvr.utils.seed."""

import random

import numpy as np
import pytest
import torch

from rlvr.utils.seed import get_rng_state, set_rng_state, set_seed


def draw():
    return random.random(), float(np.random.rand()), torch.rand(2).tolist()


def test_set_seed_is_reproducible():
    set_seed(7)
    first = draw()
    set_seed(7)
    assert draw() == first
    set_seed(8)
    assert draw() != first


def test_rng_state_round_trip_through_torch_save(tmp_path):
    set_seed(3)
    draw()
    torch.save(get_rng_state(), tmp_path / "rng.pt")
    expected = [draw() for _ in range(3)]
    set_seed(99)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=False))
    assert [draw() for _ in range(3)] == expected


def test_incomplete_state_raises():
    with pytest.raises(KeyError, match="lacks \\['numpy'\\]"):
        set_rng_state({"python": random.getstate(), "torch": torch.get_rng_state()})
