"""Generate the vision demo's data: pictures of coloured squares, "how many are red?".

Run: ``python examples/vision/generate.py --out runs/vision/data`` (defaults: ``--seed 0
--n-train 3000 --n-eval 200 --n-rl 1000``).

Each picture is 28 x 28 pixels, white, a 4 x 4 grid of 7-pixel cells (the tiny vision
tower's patches). One to four cells hold a red square, and up to three other cells a
blue, green or yellow one (the distractors); each square is 3 to 5 pixels a side at a
random place in its cell, whose last row and column stay white, so no two squares touch.
The answer is the number of red squares. The held-out layouts (which cells hold which
colour) are drawn first; a training layout equal to a held-out one is drawn again, so
the held-out layouts are never seen in training. Files written (JSONL, images as PNG files in
``images/``, referenced by paths relative to the data file):

- ``sft_train.jsonl``  chat rows: user [image, "how many red?"], assistant "3"
- ``eval.jsonl``       held-out prompts: ``{"messages": [user [image, text]], "answer": "3"}``
- ``rl_prompts.jsonl`` training-split prompts in the same shape, for RL (exact-match reward)
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

SIZE = 28          # pixels a side
CELL = 7           # the grid's cell (and the vision tower's patch) in pixels
GRID = SIZE // CELL
QUESTION = "how many red?"
RED = (220, 30, 30)
DISTRACTORS = ((30, 60, 220), (30, 170, 60), (230, 200, 30))  # blue, green, yellow
MAX_RED = 4
MAX_DISTRACTORS = 3


def layout(rng: random.Random) -> tuple[tuple[int, tuple[int, int, int]], ...]:
    """A picture's squares: (cell index, colour) pairs, sorted by cell."""
    cells = rng.sample(range(GRID * GRID), MAX_RED + MAX_DISTRACTORS)
    red = rng.randint(1, MAX_RED)
    others = rng.randint(0, MAX_DISTRACTORS)
    squares = [(cell, RED) for cell in cells[:red]]
    squares += [(cell, rng.choice(DISTRACTORS)) for cell in cells[MAX_RED:MAX_RED + others]]
    return tuple(sorted(squares))


def render(squares, rng: random.Random):
    """The PIL image of a layout, each square of random size and place in its cell."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for cell, colour in squares:
        side = rng.randint(3, 5)
        # the cell's last row and column stay white, so squares in neighbouring cells
        # never touch (each square is one blob of its colour)
        x = (cell % GRID) * CELL + rng.randint(0, CELL - 1 - side)
        y = (cell // GRID) * CELL + rng.randint(0, CELL - 1 - side)
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=colour)
    return image


def answer_of(squares) -> str:
    return str(sum(colour == RED for _, colour in squares))


def user_message(image: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                        {"type": "text", "text": QUESTION}]}


def draw_layouts(rng: random.Random, count: int, avoid: set) -> list[tuple]:
    """``count`` layouts, none of them in ``avoid``."""
    out = []
    while len(out) < count:
        squares = layout(rng)
        if squares not in avoid:
            out.append(squares)
    return out


def save_pictures(rng: random.Random, layouts: list[tuple], prefix: str, out: Path
                  ) -> list[tuple[str, str]]:
    """Render and save each layout under ``out/images``: (path relative to ``out``, answer)."""
    pictures = []
    for index, squares in enumerate(layouts):
        name = f"images/{prefix}{index:05d}.png"
        render(squares, rng).save(out / name)
        pictures.append((name, answer_of(squares)))
    return pictures


def write(path: Path, rows: list[dict]) -> None:
    """Written aside, then renamed: never a half-written file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(partial, path)


def generate(out: Path, seed: int = 0, n_train: int = 3000, n_eval: int = 200,
             n_rl: int = 1000) -> None:
    """Write the three files and their images under ``out``."""
    rng = random.Random(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    held_out = draw_layouts(rng, n_eval, set())
    layouts = {"train": draw_layouts(rng, n_train, set(held_out)),
               "rl": draw_layouts(rng, n_rl, set(held_out)), "eval": held_out}
    train, rl, held_out = (save_pictures(rng, layouts[name], name, out)
                           for name in ("train", "rl", "eval"))
    write(out / "sft_train.jsonl", [
        {"messages": [user_message(image), {"role": "assistant", "content": answer}]}
        for image, answer in train])
    write(out / "eval.jsonl", [{"messages": [user_message(image)], "answer": answer}
                               for image, answer in held_out])
    write(out / "rl_prompts.jsonl", [{"messages": [user_message(image)], "answer": answer}
                                     for image, answer in rl])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--n-rl", type=int, default=1000)
    args = parser.parse_args()
    if min(args.n_train, args.n_eval, args.n_rl) < 1:
        raise SystemExit("error: --n-train, --n-eval and --n-rl must be at least 1")
    generate(args.out, args.seed, args.n_train, args.n_eval, args.n_rl)
    print(f"wrote {args.n_train} SFT rows, {args.n_eval} held-out and {args.n_rl} RL prompts "
          f"to {args.out}")


if __name__ == "__main__":
    main()
