"""Benchmark: score 1,000 GSM8K responses with the naive reward manager (target: under 2 s).

Responses are the reference solutions of the GSM8K test split (correct), the same with a wrong
final answer, and the same without the ``####`` marker, tokenized with the tiny byte-level test
tokenizer (about 300 tokens each, a worst case for decoding). The time covers the whole
manager call: decoding prompts and responses, scoring, placing scores on the last token.

    python benchmarks/bench_reward.py [--n 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlvr.protocol import DataProto
from rlvr.reward.scorers.gsm8k import compute_score
from rlvr.utils.testing import tiny_tokenizer
from rlvr.reward.managers import NaiveRewardManager

GSM8K_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def build_batch(n: int) -> DataProto:
    """``n`` rolled-out GSM8K samples: a third correct, a third wrong, a third without ``####``."""
    tok = tiny_tokenizer()
    records = [json.loads(line) for line in GSM8K_TEST.open()]
    prompts, responses, truths = [], [], []
    for i in range(n):
        record = records[i % len(records)]
        body, answer = record["answer"].rsplit("####", 1)
        responses.append(
            [record["answer"], f"{body}#### {answer.strip()}1", f"{body}so {answer.strip()}"][i % 3]
        )
        prompts.append(record["question"])
        truths.append(answer.strip().replace(",", ""))  # as the GSM8K data prep writes the ground truth
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    response_ids = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in responses]
    P, R = max(map(len, prompt_ids)), max(map(len, response_ids))
    prompt_t = torch.full((n, P), tok.pad_token_id)
    response_t = torch.full((n, R), tok.pad_token_id)
    mask = torch.zeros(n, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        prompt_t[i, P - len(p) :] = torch.tensor(p)
        response_t[i, : len(r)] = torch.tensor(r)
        mask[i, P - len(p) : P + len(r)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompt_t, "responses": response_t, "attention_mask": mask, "response_mask": mask[:, P:]},
        non_tensors={"data_source": ["openai/gsm8k"] * n, "reward_model": [{"ground_truth": t} for t in truths]},
    ), responses, truths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="responses to score")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (the best is reported)")
    args = parser.parse_args()
    data, responses, truths = build_batch(args.n)
    manager = NaiveRewardManager(tiny_tokenizer(), num_examine=0)
    manager_times, scorer_times = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = manager(data, return_dict=True)
        manager_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for response, truth in zip(responses, truths):
            compute_score(response, truth)
        scorer_times.append(time.perf_counter() - start)
    acc = out["reward_metrics"]["reward/openai/gsm8k/mean_score"]
    best = min(manager_times)
    print(f"GSM8K reward: {args.n} responses (response_len {data.batch['responses'].shape[1]} tokens), acc {acc:.3f}")
    print(f"  naive manager (decode + score + place): best {best:.3f} s of {args.repeats} -> {args.n / best:,.0f} responses/s")
    print(f"  scorer only: best {min(scorer_times) * 1000:.1f} ms")
    print(f"  target < 2 s: {'PASS' if best < 2.0 else 'FAIL'}")


if __name__ == "__main__":
    main()
