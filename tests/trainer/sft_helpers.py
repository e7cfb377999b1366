"""A multi-turn SFT dataset with a learnable pattern, and greedy answers of a model to held-out turns.

Each conversation asks for the opposites of 2-3 words, one user turn each; a tool turn with random
letters (context only, not learnable) sits in every other conversation. The last user turn of a
held-out conversation is answered greedily and counts as right when the answer is the opposite."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

PAIRS = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("light", "dark"),
         ("wet", "dry"), ("old", "new"), ("high", "low"), ("soft", "hard"), ("open", "shut")]
OPPOSITE = {**dict(PAIRS), **{b: a for a, b in PAIRS}}
SYSTEM = "Opposites."


def conversation(rng: random.Random, index: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    for turn, word in enumerate(rng.sample(sorted(OPPOSITE), rng.choice([2, 3]))):
        messages.append({"role": "user", "content": word})
        if index % 2 and turn == 0:
            noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(4))
            messages += [{"role": "assistant", "content": "lookup"}, {"role": "tool", "content": noise}]
        messages.append({"role": "assistant", "content": OPPOSITE[word]})
    return {"messages": messages}


def write_conversations(path: Path, count: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = [conversation(rng, i) for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@torch.no_grad()
def held_out_accuracy(model, tokenizer, count: int = 40, seed: int = 99) -> float:
    """Share of held-out conversations whose last turn the model answers with the opposite (greedy)."""
    rng = random.Random(seed)
    right = 0
    for i in range(count):
        messages = conversation(rng, i)["messages"]
        truth = messages[-1]["content"]
        text = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        right += tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip() == truth
    return right / count
