#!/usr/bin/env python
"""flaxheads benchmarks: JSON lines on stdout, a markdown table at the end.

    python scripts/bench.py conversion            # MiniLM and BERT-base-size safetensors -> flaxheads
    python scripts/bench.py steps                 # train/eval step vs transformers PyTorch, same run
    python scripts/bench.py scaling               # 1 vs 4 (fake CPU) devices, compile time per bucket
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


def steps(args) -> list[dict]:
    from flaxheads.benchmarks.steps import StepBench, run
    from flaxheads.shipped_model import minilm_path

    bench = StepBench(size=args.size, seq_len=args.seq_len, batch=args.batch, dtype=args.dtype,
                      steps=args.steps, repeats=args.repeats)
    checkpoint = minilm_path() if args.size == "minilm" and args.real_weights else None
    return run(bench, checkpoint=checkpoint)


def scaling(args) -> list[dict]:
    from flaxheads.benchmarks.scaling import measure

    return measure(1, "data=1") + measure(4, "data=4") + measure(4, "data=2,fsdp=2")


def markdown(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in ("bench", "checkpoint")))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["conversion", "steps", "scaling"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="minilm", choices=["minilm", "bert-base"])
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--real_weights", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    rows = {"conversion": conversion, "steps": steps, "scaling": scaling}[args.what](args)
    for row in rows:
        print(json.dumps(row))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
