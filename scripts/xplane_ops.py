"""The operations that took the most device time in a jax profiler trace (an .xplane.pb, such as
the train_step.xplane.pb `gpu_bench.sh` brings back).

    python scripts/xplane_ops.py train_step.xplane.pb [--top 30]          # jax's reader: nothing to install
    python scripts/xplane_ops.py train_step.xplane.pb --xprof             # XProf's framework op statistics

The default reads the trace with `jax.profiler.ProfileData` (`flaxheads.benchmarks.profile_ops`):
XLA operations by their events' total time on the device timelines (the host's for a CPU trace).
`--xprof` ranks by XProf's framework op statistics instead (op types too); xprof is not a
flaxheads dependency: `python -m venv --system-site-packages /tmp/xprof && /tmp/xprof/bin/pip install xprof`,
then run this script with /tmp/xprof/bin/python.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def xprof_ops(trace: str, top: int) -> None:
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([trace], "framework_op_stats", {})
    table = json.loads(data)[0]
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, (cell.get("v") if cell else None for cell in row["c"]))) for row in table["rows"]]
    device = sorted((r for r in rows if r["host_or_device"] == "Device"), key=lambda r: -r["total_self_time"])
    total = sum(r["total_self_time"] for r in device) or 1.0
    print(f"{'self us':>10} {'%':>6} {'count':>6}  type / operation")
    for r in device[:top]:
        print(f"{r['total_self_time']:10.1f} {100 * r['total_self_time'] / total:6.2f} {r['occurrences']:6d}  "
              f"{r['type']} / {r['operation'][:100]}")
    print(f"device self time in all: {total:.1f} us over {len(device)} operations")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--xprof", action="store_true", help="XProf's framework op statistics (xprof installed)")
    args = parser.parse_args(argv)
    if args.xprof:
        xprof_ops(args.trace, args.top)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from flaxheads.benchmarks.profile_ops import top_ops

    ops, where = top_ops(args.trace, args.top)
    print(f"{'us':>10} {'%':>6} {'count':>6}  operation ({where} timelines)   module")
    for op in ops:
        print(f"{op['self_us']:10.1f} {op['percent']:6.2f} {op['count']:6d}  {op['op'][:80]}   {op['module'][:40]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
