"""Write the vision demo's untrained model: a tiny random LLaVA with its processor.

Run: ``python examples/vision/make_model.py runs/vision/base``. The test kit's LLaVA
(a CLIP vision tower seeing 28 x 28 pixels as 4 x 4 patches of 7, every patch one image
token, and the arithmetic tokenizer's characters) made wide enough to learn to count:
a language model and a vision tower of 64 units in 2 layers each (about 0.2M
parameters). Written aside, then renamed: never a half-written directory.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}
VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "projection_dim": 64}


def make_model(out: Path, seed: int = 0) -> Path:
    from astrai_core.testing.hf_vlms import write_vlm_dir

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_vlm_dir(partial, "llava", seed, text=TEXT, vision=VISION)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_model(args.out, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
