"""JSONL read two ways: astrai's own line reader and the `datasets` path that Parquet, CSV,
Arrow and hub sources take (load, check each row, write the checked JSONL).

    .venv/bin/python bench/bench_jsonl_reader.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from astrai_core.data.config import SourceConfig
from astrai_core.data.datasets_io import materialize
from astrai_core.data.sources import read_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    rows = parser.parse_args().rows
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chat.jsonl"
        with path.open("w") as handle:
            for i in range(rows):
                handle.write(json.dumps({"messages": [
                    {"role": "user", "content": f"What is {i}+{i}? Please answer briefly."},
                    {"role": "assistant", "content": f"The answer is {2 * i}."}]}) + "\n")
        start = time.perf_counter()
        count = sum(1 for _ in read_rows(path, "chat"))
        own = time.perf_counter() - start
        start = time.perf_counter()
        materialize(SourceConfig(path=path, format="chat"), Path(tmp) / "cache", "data")
        through = time.perf_counter() - start
    print(f"{count} chat rows: own JSONL reader {own:.2f} s, through datasets {through:.2f} s")


if __name__ == "__main__":
    main()
