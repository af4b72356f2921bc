"""The operations that took the most device time in a jax profiler trace (an .xplane.pb, such as
the train_step.xplane.pb `gpu_bench.sh` brings back), by XProf's framework op statistics.

    python -m venv --system-site-packages /tmp/xprof && /tmp/xprof/bin/pip install xprof
    /tmp/xprof/bin/python scripts/xplane_ops.py train_step.xplane.pb [--top 30]

xprof is not a flaxheads dependency: install it where the trace is read, as above.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([args.trace], "framework_op_stats", {})
    table = json.loads(data)[0]
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, (cell.get("v") if cell else None for cell in row["c"]))) for row in table["rows"]]
    device = sorted((r for r in rows if r["host_or_device"] == "Device"), key=lambda r: -r["total_self_time"])
    total = sum(r["total_self_time"] for r in device) or 1.0
    print(f"{'self us':>10} {'%':>6} {'count':>6}  type / operation")
    for r in device[: args.top]:
        print(f"{r['total_self_time']:10.1f} {100 * r['total_self_time'] / total:6.2f} {r['occurrences']:6d}  "
              f"{r['type']} / {r['operation'][:100]}")
    print(f"device self time in all: {total:.1f} us over {len(device)} operations")


if __name__ == "__main__":
    main()
