"""The GPU record's jobs (`scripts/gpu_bench.sh`), their order, and the one-screen summary.

    python -m flaxheads.benchmarks.gpu_run --out rows.jsonl bert_bf16 profile ...   # run jobs, append rows
    python -m flaxheads.benchmarks.gpu_run --summary rows.jsonl                      # the summary
    python -m flaxheads.benchmarks.gpu_run --tiny --out rows.jsonl JOB ...           # tiny shapes (CPU check)

A device command stops at 10 minutes, so rows are written as each job finishes and the jobs that
decide the next fix come first (`ORDER`). `--tiny` runs every job at shapes a CPU finishes in
seconds: what tests/test_gpu_bench.py runs, so that the GPU run cannot fail on its own plumbing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Callable

ORDER = (
    # (extra XLA_FLAGS for the interpreter, jobs); each group runs in its own interpreter.
    ("", ("bert_bf16", "bert_bf16_vocabulary_scatter_add", "bert_bf16_scatter_add",
          "bert_bf16_scatter_add_vocabulary_sorted", "profile", "minilm_bf16", "bert_bf16_512", "reward_1b",
          "fused_attention", "decoder_left_padding")),
    ("--xla_backend_extra_options=-nvptx-allow-ftz-atomics", ("bert_bf16_scatter_add_ftz",)),
    ("", ("bert_bf16_no_attention_dropout", "reward_1b_remat", "bert_f32")),
)
"""The issue's order: BERT-base bf16 seq 128 b128 train (with the vocabulary fix, as it was before
it, all scatter-add, scatter-add but the vocabulary), the profile, MiniLM, seq 512, the 1B Llama
LoRA reward step, the fused attention check, decoder left padding; then the rest."""

TOP_OPS = 20
"""Device operations the profile job reports."""


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The shapes the jobs run at: the record's, or `tiny()` ones for a CPU."""
    size: str = "bert-base"
    small: str = "minilm"
    seq: int = 128
    batch: int = 128
    long_seq: int = 512
    long_batch: int = 32
    steps: int = 10
    repeats: int = 5
    warmup: int = 2
    reward_shape: tuple | None = None
    """None: `RewardBench`'s 1B Llama."""
    reward_pairs: int = 8
    reward_seq: int = 512
    fused: dict = dataclasses.field(default_factory=dict)
    """`fused_check.run_all`'s keyword arguments."""

    @classmethod
    def tiny(cls) -> Shapes:
        llama = dict(model_type="llama", vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
        return cls(size="tiny", small="tiny", seq=16, batch=4, long_seq=32, long_batch=2, steps=1, repeats=1,
                   warmup=1, reward_shape=tuple(llama.items()), reward_pairs=2, reward_seq=16,
                   fused=dict(batch=2, seq=32, heads=4, head_dim=8, repeats=1))


OFF = 2**62
"""A row limit no table reaches: `SORTED_GRADIENT_ROWS` off; `ONE_HOT_GRADIENT_ROWS=0` is its off."""


def jobs(shapes: Shapes) -> dict[str, Callable[[], list[dict[str, Any]]]]:
    """Job name -> a function returning its rows."""
    from flaxheads.backbones.layers import gradient_paths
    from flaxheads.benchmarks import fused_check, reward_step
    from flaxheads.benchmarks.step_shapes import StepBench
    from flaxheads.benchmarks.steps import run

    def bench(**kw) -> StepBench:
        kw = {"size": shapes.size, "seq_len": shapes.seq, "batch": shapes.batch, "dtype": "bfloat16",
              "steps": shapes.steps, "repeats": shapes.repeats, "warmup": shapes.warmup, **kw}
        return StepBench(**kw)

    bert = bench()

    def variant(name: str, **limits):
        """flaxheads' train step alone with the embedding gradient's paths limited (`layers`' row limits)."""
        def job():
            with gradient_paths(**limits):
                return [dict(r, variant=name) for r in run(bert, torch_peer=False, steps=("train",))]
        return job

    def reward(**kw):
        extra = {} if shapes.reward_shape is None else {"shape": shapes.reward_shape}
        return lambda: [reward_step.run(reward_step.RewardBench(pairs=shapes.reward_pairs, seq=shapes.reward_seq,
                                                                **extra, **kw))]

    return {
        # The target, BERT-base bf16 seq 128 batch 128 against transformers PyTorch as users run
        # it; flaxheads with the vocabulary fix (`layers.SORTED_GRADIENT_ROWS`) and the one-hot gradient.
        "bert_bf16": lambda: run(bert),
        "bert_bf16_vocabulary_scatter_add": variant("vocabulary scatter-add (before the vocabulary fix)",
                                                    SORTED_GRADIENT_ROWS=OFF),
        "bert_bf16_scatter_add": variant("every table scatter-add", ONE_HOT_GRADIENT_ROWS=0, SORTED_GRADIENT_ROWS=OFF),
        "bert_bf16_scatter_add_vocabulary_sorted": variant("small tables scatter-add, vocabulary sorted",
                                                           ONE_HOT_GRADIENT_ROWS=0),
        "bert_bf16_scatter_add_ftz": variant("every table scatter-add, -nvptx-allow-ftz-atomics",
                                             ONE_HOT_GRADIENT_ROWS=0, SORTED_GRADIENT_ROWS=OFF),
        "profile": lambda: profile(bert),
        "minilm_bf16": lambda: run(bench(size=shapes.small)),
        "bert_bf16_512": lambda: run(bench(seq_len=shapes.long_seq, batch=shapes.long_batch)),
        "reward_1b": reward(),
        "fused_attention": lambda: fused_check.run_all(**shapes.fused),
        "decoder_left_padding": lambda: decoder_left_padding(bench(arch="llama", padding="left",
                                                                   attention_dropout=0.0)),
        "bert_bf16_no_attention_dropout": lambda: run(bench(attention_dropout=0.0)),
        "reward_1b_remat": reward(gradient_checkpointing=True),
        "bert_f32": lambda: run(bench(dtype="float32", batch=max(shapes.batch // 2, 1),
                                      repeats=max(shapes.repeats - 2, 1))),
    }


def profile(bench) -> list[dict[str, Any]]:
    """3 train steps of `bench` under jax's profiler: the trace goes to $OUT/train_step.xplane.pb
    (a file the device tool brings back), and its `TOP_OPS` operations by device time (or host
    time where the trace has no device: a CPU) come back as rows."""
    import glob
    import shutil
    import tempfile

    import jax

    from flaxheads.benchmarks.profile_ops import top_ops
    from flaxheads.benchmarks.steps import flaxheads_runners

    train = next(r for r in flaxheads_runners(bench) if r.step == "train")
    train.run(3)  # compiled and warm
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        train.run(3)
    traces = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    target = os.path.join(os.environ.get("OUT", "."), "train_step.xplane.pb")
    shutil.copy(traces[0], target)
    ops, where = top_ops(target, TOP_OPS)
    return [{"bench": "profile", "trace": target, "bytes": os.path.getsize(target), "timeline": where, **op}
            for op in ops]


def decoder_left_padding(bench) -> list[dict[str, Any]]:
    """A decoder's train step on a left-padded batch: as built (the family pads left, so attention
    takes XLA's path while tracing) and with the side unknown to the model (cuDNN's adapter checks
    for right padding at run time, then runs XLA's kernel); flaxheads alone."""
    from flaxheads import backbones
    from flaxheads.benchmarks.steps import run

    rows = [dict(r, variant="padding side known (static XLA)")
            for r in run(bench, torch_peer=False, steps=("train",))]
    model_type = bench.hf_config()["model_type"]
    spec = backbones.BACKBONES[model_type]
    backbones.BACKBONES[model_type] = dataclasses.replace(spec, padding_side="right")
    try:
        rows += [dict(r, variant="padding side unknown (run-time check)")
                 for r in run(bench, torch_peer=False, steps=("train",))]
    finally:
        backbones.BACKBONES[model_type] = spec
    return rows


def run_jobs(names: list[str], out_path: str, shapes: Shapes) -> None:
    """Runs the jobs in turn, appending each row to `out_path` (JSON lines) and printing it; a job
    that raises gives one row with its error, and the next job runs."""
    table = jobs(shapes)
    with open(out_path, "a") as out:
        for name in names:
            try:
                rows = table[name]()
            except Exception as err:  # keep going: one failing job must not lose the others  # noqa: BLE001
                rows = [{"error": repr(err)[:2000]}]
            for row in rows:
                line = json.dumps({"job": name, **row}, default=str)
                print(line, flush=True)
                out.write(line + "\n")
                out.flush()


def summary(rows: list[dict[str, Any]]) -> str:
    """One screen: a line per timed step (ms, ratio to flaxheads, MFU), per reward step, per fused
    attention case, the profile's top operations, and every error."""
    lines = [f"{'job':<40} {'implementation / variant':<56} {'step':<5} {'ms':>8} {'ratio':>6} {'MFU':>6}"]
    fused, profile_rows, errors = [], [], []
    for row in rows:
        job = row.get("job", "?")
        if "error" in row:
            errors.append(f"{job}{' / ' + row['case'] if 'case' in row else ''}: {row['error'][:150]}")
        elif row.get("bench") == "fused_attention":
            fused.append(row)
        elif row.get("bench") == "profile":
            profile_rows.append(row)
        elif row.get("bench") == "matmul_peak":
            continue
        elif "step_s_median" in row:
            impl = row.get("variant") or row.get("impl", "flaxheads")
            if "impl" in row and not row["impl"].startswith("flaxheads"):  # the peer: its setup, not its versions
                impl = "PyTorch " + row["impl"][row["impl"].find("("):] if "(" in row["impl"] else row["impl"]
            ratio = row.get("flaxheads_speedup")
            mfu = row.get("mfu_vs_published")
            lines.append(f"{job:<40} {impl[:56]:<56} {row.get('step', 'train'):<5} "
                         f"{1e3 * row['step_s_median']:8.2f} {'' if ratio is None else f'{ratio:.2f}x':>6} "
                         f"{'' if mfu is None else f'{100 * mfu:.1f}%':>6}")
    if fused:
        lines.append("fused attention: " + "; ".join(
            f"{r['case']}: {r['chosen']} {'ok' if r['passes'] else 'FAILS'} {r['speedup']}x" for r in fused))
    if profile_rows:
        lines.append(f"profile ({profile_rows[0]['timeline']} time), top {len(profile_rows)}:")
        lines += [f"  {r['percent']:5.1f}% {r['self_us']:10.1f} us x{r['count']:<5} {r['op'][:90]}"
                  for r in profile_rows]
    lines += [f"ERROR {e}" for e in errors]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="*", help="job names (`jobs`), run in this order")
    parser.add_argument("--out", help="append the rows to this JSON-lines file")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, for a CPU")
    parser.add_argument("--summary", help="print the summary of this JSON-lines file and stop")
    parser.add_argument("--groups", action="store_true", help="print ORDER as 'XLA_FLAGS|jobs' lines and stop "
                        "(only the jobs GPU_BENCH_JOBS names, when it is set)")
    args = parser.parse_args(argv)
    if args.groups:
        only = os.environ.get("GPU_BENCH_JOBS", "").split()  # a subset (the tests' end-to-end run)
        groups = [(flags, [n for n in names if not only or n in only]) for flags, names in ORDER]
        print("\n".join(f"{flags}|{' '.join(names)}" for flags, names in groups if names))
        return 0
    if args.summary:
        with open(args.summary) as f:
            print(summary([json.loads(line) for line in f if line.strip()]))
        return 0
    unknown = [name for name in args.jobs if name not in jobs(Shapes())]
    if unknown or not args.out:
        parser.error(f"give --out FILE and job names among {sorted(jobs(Shapes()))}" +
                     (f" (unknown: {unknown})" if unknown else ""))
    run_jobs(args.jobs, args.out, Shapes.tiny() if args.tiny else Shapes())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
