"""flaxheads benchmarks: JSON lines on stdout, then markdown tables.

    flaxheads bench                          # steps (BERT, MiniLM, seq 128) + conversion
    flaxheads bench steps --arch bert,gpt2,xlnet --size minilm,bert-base --seq_len 128,512
    flaxheads bench steps --hf-flax-python /path/to/env/bin/python   # + Hugging Face Flax 4.57
    flaxheads bench steps --size bert-base,minilm-24l --scan_layers --no-torch   # loop vs scan over layers
    flaxheads bench conversion               # MiniLM and BERT-base-size safetensors -> flaxheads
    flaxheads bench scaling                  # 1 vs 4 (fake CPU) devices, compile time per bucket
    flaxheads bench load                     # a random 1.3B bf16 sharded checkpoint: load s, peak RSS
    flaxheads bench e2e --json e2e.json      # the default train job: Trainer vs flaxheads (cold, warm cache)
    flaxheads bench e2e --unpacked           # ... and flaxheads without sequence packing
    flaxheads bench e2e --rounds 3           # Trainer and flaxheads (warm) take turns: ratios per round
    flaxheads bench checkpoint               # seconds a save blocks training: synchronous vs asynchronous

`python scripts/bench.py ...` is the same program. Steps compare flaxheads with transformers
PyTorch (eager on CPU, bf16 autocast + SDPA on GPU) on the same config, batch and data, taking
turns within every timing round in one process; the Hugging Face Flax peer (BERT only) runs
afterwards in the second environment that `scripts/make_hf_flax_env.sh` builds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile

from flaxheads import atomic


def _csv(kind):
    return lambda text: [kind(part) for part in text.split(",")]


def conversion(args) -> list[dict]:
    from flaxheads.benchmarks import conversion as bench
    from flaxheads.shipped_model import minilm_path

    rows = [dict(bench.measure(minilm_path(), args.repeats), model="MiniLM-L6-H384 (real)")]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(dict(bench.measure(bench.random_bert_base(tmp), args.repeats), model="BERT-base size (random)"))
    return rows


def steps(args) -> list[dict]:
    from flaxheads.benchmarks.step_shapes import StepBench
    from flaxheads.benchmarks.steps import run
    from flaxheads.shipped_model import minilm_path

    rows = []
    for arch, size, seq_len in itertools.product(args.arch, args.size, args.seq_len):
        bench = StepBench(arch=arch, size=size, seq_len=seq_len, batch=args.batch, dtype=args.dtype,
                          steps=args.steps, repeats=args.repeats)
        real = args.real_weights and arch == "bert" and size == "minilm"
        rows += run(bench, torch_peer=args.torch, checkpoint=minilm_path() if real else None,
                    hf_flax_python=args.hf_flax_python if arch == "bert" else None, scan_layers=args.scan_layers)
    return rows


def e2e(args) -> list[dict]:
    from flaxheads.benchmarks import e2e as bench

    job = bench.E2EJob.default(max_steps=args.max_steps, max_train_samples=args.max_train_samples,
                               max_eval_samples=args.max_eval_samples, dtype=args.dtype, model=args.model,
                               max_seq_length=args.max_seq_length)
    unpacked = job.unpacked() if args.unpacked else None
    return bench.measure(job, torch_peer=args.torch, flaxheads_runs=args.flaxheads_runs, unpacked_job=unpacked,
                         trainer_huge_pages=args.trainer_huge_pages, rounds=args.rounds)


def scaling(args) -> list[dict]:
    from flaxheads.benchmarks.scaling import measure

    return measure(1, "data=1") + measure(4, "data=4") + measure(4, "data=2,fsdp=2")


def checkpoint(args) -> list[dict]:
    from flaxheads.benchmarks.checkpoint_save import measure

    return measure(args.model)


def load(args) -> list[dict]:
    from flaxheads.benchmarks import loading

    shape = json.loads(args.load_shape) if args.load_shape else loading.BERT_1B
    return [loading.measure(shape, mesh=args.mesh)]


STEP_COLUMNS = {
    "arch": "arch", "size": "size", "seq_len": "seq", "batch": "batch", "dtype": "dtype", "impl": "implementation",
    "step": "step", "step_s": "s/step median (min-max)", "examples_per_s": "examples/s", "tokens_per_s": "tokens/s",
    "tflops": "TFLOP/s", "util_vs_measured_matmul": "of same-run matmul peak", "mfu_vs_published": "MFU (published peak)",
    "first_step_s": "first step s", "flaxheads_speedup": "flaxheads speed-up",
}


def markdown(rows: list[dict]) -> str:
    """One table per kind of row; step rows in the columns above, others with all their keys."""
    kinds: dict[str, list[dict]] = {}
    for row in rows:
        kinds.setdefault(row.get("bench", "step"), []).append(row)
    tables = []
    for kind, group in kinds.items():
        if kind == "step":
            group = [dict(r, step_s=f"{r['step_s_median']:.3f} ({r['step_s_min']:.3f}-{r['step_s_max']:.3f})",
                          first_step_s=round(r["first_step_s"], 1)) for r in group]
            keys, names = list(STEP_COLUMNS), list(STEP_COLUMNS.values())
        else:
            keys = list(dict.fromkeys(k for r in group for k in r if k not in ("bench", "checkpoint")))
            names = keys
        lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join("" if r.get(k) is None else str(r[k]) for k in keys) + " |" for r in group]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="flaxheads bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="?", default="all",
                        choices=["all", "steps", "conversion", "scaling", "load", "e2e", "checkpoint"],
                        help="all (default): steps, then conversion")
    parser.add_argument("--arch", type=_csv(str), default=["bert"], help="comma list of bert, roberta, xlm-roberta, gpt2, xlnet, electra, albert, distilbert, deberta-v3, modernbert, llama")
    parser.add_argument("--size", type=_csv(str), default=["minilm"],
                        help="comma list of minilm, bert-base, minilm-24l (MiniLM's width, 24 layers)")
    parser.add_argument("--scan_layers", action="store_true",
                        help="steps: also time flaxheads with its layers scanned (first step = compile time)")
    parser.add_argument("--seq_len", type=_csv(int), default=[128], help="comma list, e.g. 128,512")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median and spread over them)")
    parser.add_argument("--real_weights", action=argparse.BooleanOptionalAction, default=True,
                        help="BERT at MiniLM size uses the shipped pretrained checkpoint on every side")
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="time transformers PyTorch as a peer")
    parser.add_argument("--hf-flax-python", "--hf_flax_python", dest="hf_flax_python",
                        help="python of an environment from scripts/make_hf_flax_env.sh: adds Hugging Face Flax 4.57")
    parser.add_argument("--load_shape", help="load: the checkpoint's config.json as JSON (model_type and sizes); "
                        "default: BERT-shaped, hidden 2048, 24 layers (1.3B parameters)")
    parser.add_argument("--mesh", help='load: place the parameters on this mesh, e.g. "fsdp=4"; default: one device')
    e2e = parser.add_argument_group("e2e", "the default `flaxheads train` job, end to end")
    e2e.add_argument("--max_steps", type=int, default=-1, help="cut the job to this many steps (default: one epoch)")
    e2e.add_argument("--max_train_samples", type=int, help="train on the first N train examples only")
    e2e.add_argument("--max_eval_samples", type=int, help="score the first N validation and test examples only")
    e2e.add_argument("--max_seq_length", type=int, help="default: flaxheads train's (128)")
    e2e.add_argument("--model", help="model folder for e2e and checkpoint (default: the shipped MiniLM)")
    e2e.add_argument("--unpacked", action="store_true",
                     help="also run flaxheads without sequence packing (`flaxheads train --no_packing`: padded "
                          "batches grouped by length)")
    e2e.add_argument("--trainer_huge_pages", action="store_true",
                     help="also run the Trainer with glibc's huge pages (flaxheads runs with them, as its "
                          "command starts; the Trainer runs without them, as plain python does)")
    e2e.add_argument("--rounds", type=int, default=1,
                     help="take turns this many times: the Trainer, then each flaxheads job (cold and warm in the "
                          "first round, warm after); each row is compared with the Trainer of its round")
    e2e.add_argument("--flaxheads_runs", type=int, default=2,
                     help="flaxheads runs sharing a compilation cache that starts empty (1: cold only)")
    e2e.add_argument("--json", help="also write the rows to this new JSON file (an existing one is refused)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_args(build_parser().parse_args(argv))


def run_args(args) -> int:
    jobs = {"all": [steps, conversion], "steps": [steps], "conversion": [conversion], "scaling": [scaling],
            "load": [load], "e2e": [e2e], "checkpoint": [checkpoint]}[args.what]
    if getattr(args, "json", None) and os.path.exists(args.json):
        # Checked before minutes of benchmarking, and never replaced: it may be someone's results.
        print(f"flaxheads bench: --json {args.json} already exists; remove it or choose another path",
              file=sys.stderr)
        return 2
    rows = [row for job in jobs for row in job(args)]
    for row in rows:
        print(json.dumps(row), flush=True)
    if getattr(args, "json", None):
        atomic.write_json(args.json, rows)
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
