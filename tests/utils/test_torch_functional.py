"""Tests of rlvr.utils.torch_functional with hand-computed values (verl's names and signatures)."""

import math

import pytest
import torch

from rlvr.utils.torch_functional import (
    calculate_sum_pi_squared_from_logits,
    clip_by_value,
    compute_position_ids,
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    expand_as_nested,
    gather_from_labels,
    get_response_mask,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    pad_2d_list_to_length,
    pad_sequence_to_length,
)

VALUES = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, float("nan"), 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 1]])


def test_masked_sum_and_mean_ignore_masked_values_even_nan():
    assert masked_sum(VALUES, MASK).item() == 17.0  # 1+2+3+4+7
    assert masked_sum(VALUES, MASK, axis=-1).tolist() == [6.0, 11.0]
    assert masked_mean(VALUES, MASK).item() == pytest.approx(17 / 5)
    assert masked_mean(VALUES, MASK, axis=1).tolist() == pytest.approx([2.0, 5.5])
    assert masked_mean(VALUES, MASK, axis=0).tolist() == pytest.approx([2.5, 2.0, 3.0, 7.0])


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_masked_var_known_vector():
    # values 1,2,3,4,7: mean 3.4, squared deviations 5.76+1.96+0.16+0.36+12.96 = 21.2
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(21.2 / 5)
    assert masked_var(VALUES, MASK).item() == pytest.approx(21.2 / 4)


def test_masked_var_degenerate_masks_raise():
    with pytest.raises(ValueError, match="selects one element"):
        masked_var(torch.tensor([[3.0, 1.0]]), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="selects no element"):
        masked_var(torch.tensor([[3.0, 1.0]]), torch.tensor([[0, 0]]))
    assert masked_var(torch.tensor([[3.0, 1.0]]), torch.tensor([[1, 0]]), unbiased=False).item() == 0.0


def test_masked_whiten():
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased var 1
    expected = torch.tensor([-1.0, 0.0, 1.0, 7.0]) / math.sqrt(1 + 1e-8)
    assert torch.allclose(masked_whiten(values, mask)[0], expected)
    assert torch.allclose(masked_whiten(values, mask, shift_mean=False)[0], expected + 2.0)


def reference_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def test_logprobs_hand_computed():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])  # probs [1/4, 3/4] and [1/2, 1/2]
    labels = torch.tensor([[1, 0]])
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32 and out.shape == (1, 2)
    assert out[0].tolist() == pytest.approx([math.log(0.75), math.log(0.5)])


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
def test_logprobs_match_reference_values_and_grads(chunk_size):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=gen) * 4).requires_grad_()
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    weights = torch.randn(3, 5, generator=gen)
    out = logprobs_from_logits(logits, labels, chunk_size=chunk_size)
    (out * weights).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref = reference_logprobs(logits, labels)
    (ref * weights).sum().backward()
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.allclose(grad, logits.grad, atol=1e-6)


def test_logprobs_bf16_and_non_contiguous_slice():
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(2, 7, 13, generator=gen).bfloat16().requires_grad_()
    labels = torch.randint(0, 13, (2, 4), generator=gen)
    sliced = full[:, 2:6, :]  # like logits[:, -response_len - 1 : -1]
    out = logprobs_from_logits(sliced, labels, chunk_size=3)
    assert out.dtype == torch.float32
    assert torch.allclose(out, reference_logprobs(sliced.detach(), labels), atol=1e-6)
    out.sum().backward()
    assert full.grad.dtype == torch.bfloat16
    assert full.grad[:, :2].abs().sum().item() == 0.0 and full.grad[:, 2:6].abs().sum().item() > 0


def test_logprobs_shape_mismatch():
    with pytest.raises(ValueError, match="disagree"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_hand_computed_and_stable():
    uniform = torch.zeros(1, 4)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[1000.0, 0.0, 0.0]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two = torch.tensor([[0.0, math.log(3.0)]])  # p = [1/4, 3/4]
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(two).item() == pytest.approx(expected)


def test_entropy_grads_match_reference():
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 3, 9, generator=gen) * 3).requires_grad_()
    weights = torch.randn(2, 3, generator=gen)
    out = entropy_from_logits(logits, chunk_size=2)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    (out * weights).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    probs = torch.softmax(logits, -1)
    ref = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    (ref * weights).sum().backward()
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(grad, logits.grad, atol=1e-5)
    assert entropy_from_logits(torch.zeros(2, 3, 4).bfloat16()).dtype == torch.float32


def test_compute_position_ids_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert compute_position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_get_response_mask_first_eos_inclusive():
    ids = torch.tensor([[5, 6, 2, 0, 2], [5, 2, 9, 9, 9], [5, 6, 7, 8, 9], [9, 9, 3, 2, 0]])
    assert get_response_mask(ids, eos_token=2).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0],
    ]
    assert get_response_mask(response_id=ids).tolist() == get_response_mask(ids, 2).tolist()  # verl's default 2
    multi = get_response_mask(ids, eos_token=[3, 2], dtype=torch.float32)
    assert multi.dtype == torch.float32
    assert multi[3].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_pad_sequence_to_length():
    x = torch.tensor([[1, 2], [3, 4]])
    assert pad_sequence_to_length(x, 4, 0).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert pad_sequence_to_length(x, 3, pad_token_id=9, left_pad=True).tolist() == [[9, 1, 2], [9, 3, 4]]
    assert pad_sequence_to_length(x, max_seq_len=2, pad_token_id=0) is x


def test_pad_2d_list_to_length():
    assert pad_2d_list_to_length([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_2d_list_to_length([[1, 2, 3], [4]], 7, max_length=5).tolist() == [[1, 2, 3, 7, 7], [4, 7, 7, 7, 7]]
    assert pad_2d_list_to_length([[1, 2, 3]], 0, max_length=2).tolist() == [[1, 2, 3]]  # never truncates


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([0.0, 5.0, -5.0])
    lo, hi = torch.tensor([-1.0, 1.0, -2.0]), torch.tensor([1.0, 2.0, 3.0])
    assert clip_by_value(x, lo, hi).tolist() == [0.0, 2.0, -2.0]


def test_gather_from_labels():
    data = torch.arange(12.0).view(2, 2, 3)
    assert gather_from_labels(data, torch.tensor([[2, 0], [1, 1]])).tolist() == [[2.0, 3.0], [7.0, 10.0]]


def test_entropy_from_logits_with_chunking_matches_unchunked():
    logits = torch.randn(7, 11, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(entropy_from_logits_with_chunking(logits, chunk_size=3), entropy_from_logits(logits))


def test_calculate_sum_pi_squared_from_logits():
    # uniform over 3: 3 * (1/3)^2 = 1/3; probabilities [0.5, 0.25, 0.25]: 0.25 + 2 * 0.0625 = 0.375
    logits = torch.stack([torch.zeros(3), torch.tensor([0.5, 0.25, 0.25]).log()])
    torch.testing.assert_close(calculate_sum_pi_squared_from_logits(logits), torch.tensor([1 / 3, 0.375]))
    shifted = logits + 60.0  # exp(2 * 60) would overflow float32; the log-sum-exp form does not
    torch.testing.assert_close(calculate_sum_pi_squared_from_logits(shifted), torch.tensor([1 / 3, 0.375]))


def test_expand_as_nested():
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3), torch.zeros(1)], layout=torch.jagged)
    out = expand_as_nested(torch.tensor([1.0, 2.0, 3.0]), nested)
    assert out.is_nested
    assert [row.tolist() for row in out.unbind()] == [[1.0, 1.0], [2.0, 2.0, 2.0], [3.0]]
    for bad_tensor, bad_nested, message in [
        (torch.ones(3), torch.zeros(3, 2), "must be a nested"),
        (torch.ones(2), nested, "batch sizes differ"),
        (torch.ones(3, 1), nested, "need tensor"),
    ]:
        for error in (ValueError, AssertionError):  # verl asserts
            with pytest.raises(error, match=message):
                expand_as_nested(bad_tensor, bad_nested)


def test_backward_keeps_no_float32_copy_of_the_logits():
    logits = torch.randn(4, 6, 50).bfloat16().requires_grad_()
    labels = torch.randint(0, 50, (4, 6))
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tensor.numel()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs_from_logits(logits, labels, chunk_size=5).sum().backward()
        entropy_from_logits(logits, chunk_size=5).sum().backward()
    assert (torch.bfloat16, logits.numel()) in saved
    assert all(numel < logits.numel() for dtype, numel in saved if dtype == torch.float32)
