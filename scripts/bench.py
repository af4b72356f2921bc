#!/usr/bin/env python
"""flaxheads benchmarks: JSON lines on stdout, a markdown table at the end.

    python scripts/bench.py conversion            # MiniLM and BERT-base-size safetensors -> flaxheads
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile


def conversion(args) -> list[dict]:
    from flaxheads.benchmarks import conversion as bench
    from flaxheads.shipped_model import minilm_path

    rows = [dict(bench.measure(minilm_path(), args.repeats), model="MiniLM-L6-H384 (real)")]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(dict(bench.measure(bench.random_bert_base(tmp), args.repeats), model="BERT-base size (random)"))
    return rows


def markdown(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if k not in ("bench", "checkpoint")]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["conversion"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = {"conversion": conversion}[args.what](args)
    for row in rows:
        print(json.dumps(row))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
