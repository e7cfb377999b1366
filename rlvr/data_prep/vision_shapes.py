"""Data of the vision job: drawn shapes, questions about them, one-word answers.

Every image is a 48x48 picture of one shape (circle, square or triangle) in one of six colours on
a light background, at a random size and place, drawn with PIL at 4x and scaled down (anti-aliased).
Three files of rows in verl's format (images as PNG files beside them, ``images`` column, one
``<image>`` placeholder in the prompt):

- ``train.jsonl``: the RL questions, "What colour is the shape? Answer with one word." and "What
  shape is it? Answer with one word.", each after a text-only example exchange in that format
  (``EXAMPLES``: "What colour is snow? ..." -> "White"), the answer scored by the
  ``vision_shapes`` scorer (the response, lower-cased and without a final full stop, must be the word);
- ``test.jsonl``: the same questions on held-out images (drawn from another random stream: no
  image of the test set is in training);
- ``warm.jsonl``: captions for the supervised warm start, "What is in the image?" -> "A red circle."
  (:mod:`rlvr.data_prep.vision_warm_start`), on images of their own.

The warm start teaches the vision encoder and projector to see colour and shape through captions;
the RL questions ask for one attribute in one word, a related format the caption training never
showed. Run::

    python -m rlvr.data_prep.vision_shapes --out data/vision
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from rlvr.reward.scorers.vision_shapes import COLOUR_WORDS, SHAPE_WORDS
from rlvr.trainer.data import write_rows

__all__ = ["COLOURS", "SHAPES", "QUESTIONS", "EXAMPLES", "CAPTION_QUESTION", "DATA_SOURCE", "IMAGE_SIZE", "draw_shape",
           "question_rows", "caption_rows", "write_dataset"]

DATA_SOURCE = "vision_shapes"
IMAGE_SIZE = 48
COLOURS = dict(zip(COLOUR_WORDS, [(215, 40, 40), (40, 160, 60), (40, 80, 215), (235, 200, 30), (140, 60, 175),
                                   (240, 130, 30)], strict=True))
SHAPES = SHAPE_WORDS
QUESTIONS = {"colour": "What colour is the shape? Answer with one word.",
             "shape": "What shape is it? Answer with one word."}
EXAMPLES = {"colour": ("What colour is snow? Answer with one word.", "White"),
            "shape": ("What shape is a stop sign? Answer with one word.", "Octagon")}
"""A text-only exchange shown before each question (its answer is never one of the job's words): it
shows the one-word format, which the caption warm start ("A red circle.") does not."""
CAPTION_QUESTION = "What is in the image?"
_SCALE = 4  # drawn at 4x, then scaled down


def draw_shape(rng: random.Random, colour: str, shape: str) -> Image.Image:
    """A ``IMAGE_SIZE``-square RGB image of one shape (see the module docstring)."""
    size = IMAGE_SIZE * _SCALE
    grey = rng.randint(225, 250)
    image = Image.new("RGB", (size, size), (grey, grey, grey))
    side = rng.uniform(0.45, 0.8) * size
    left, top = rng.uniform(0, size - side), rng.uniform(0, size - side)
    box = (left, top, left + side, top + side)
    fill = COLOURS[colour]
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(left + side / 2, top), (left + side, top + side), (left, top + side)], fill=fill)
    return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)


def _draw_all(rng: random.Random, count: int, folder: Path, prefix: str) -> list[tuple[str, str, str]]:
    """Draw ``count`` images into ``folder``; ``(relative path, colour, shape)`` of each."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        name = f"{prefix}_{i:05d}.png"
        draw_shape(rng, colour, shape).save(folder / name)
        out.append((f"{folder.name}/{name}", colour, shape))
    return out


def question_rows(images: list[tuple[str, str, str]], split: str) -> list[dict[str, Any]]:
    """One question per image, colour and shape questions alternating."""
    rows = []
    for i, (path, colour, shape) in enumerate(images):
        kind = "colour" if i % 2 == 0 else "shape"
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": EXAMPLES[kind][0]},
                       {"role": "assistant", "content": EXAMPLES[kind][1]},
                       {"role": "user", "content": f"<image>{QUESTIONS[kind]}"}],
            "images": [path],
            "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": colour if kind == "colour" else shape},
            "extra_info": {"split": split, "index": i, "question": kind, "colour": colour, "shape": shape},
        })
    return rows


def caption_rows(images: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Warm-start rows: the caption question and its answer (``answer`` column)."""
    return [{"prompt": [{"role": "user", "content": f"<image>{CAPTION_QUESTION}"}], "images": [path],
             "answer": f"A {colour} {shape}.", "extra_info": {"colour": colour, "shape": shape}}
            for path, colour, shape in images]


def write_dataset(out: str | Path, train: int, test: int, warm: int, seed: int = 0) -> None:
    """Draw the images and write ``train.jsonl``, ``test.jsonl`` and ``warm.jsonl`` into ``out``.
    The three sets come from separate random streams (held-out images are never trained on)."""
    out = Path(out)
    test_images = _draw_all(random.Random(f"{seed}-test"), test, out / "images_test", "test")
    train_images = _draw_all(random.Random(f"{seed}-train"), train, out / "images_train", "train")
    warm_images = _draw_all(random.Random(f"{seed}-warm"), warm, out / "images_warm", "warm")
    write_rows(question_rows(train_images, "train"), out / "train.jsonl")
    write_rows(caption_rows(warm_images), out / "warm.jsonl")
    write_rows(question_rows(test_images, "test"), out / "test.jsonl")  # written last: make's target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/vision", help="output folder")
    parser.add_argument("--train", type=int, default=2000, help="RL training questions")
    parser.add_argument("--test", type=int, default=100, help="held-out questions")
    parser.add_argument("--warm", type=int, default=2000, help="warm-start captions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_dataset(args.out, args.train, args.test, args.warm, args.seed)


if __name__ == "__main__":
    main()
