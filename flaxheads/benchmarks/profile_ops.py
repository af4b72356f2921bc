"""The operations that took the most time in a jax profiler trace (an .xplane.pb, such as the
train_step.xplane.pb `gpu_bench.sh` brings back), read with jax's own `jax.profiler.ProfileData`:
nothing to install where the trace is taken or read (`scripts/xplane_ops.py` is the command)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def top_ops(trace: str, top: int = 20) -> tuple[list[dict[str, Any]], str]:
    """(the `top` XLA operations by total time, "device" or "host"): each {"op", "module",
    "self_us", "percent", "count"}, summed over every event that names its HLO operation (the
    `hlo_op` stat XLA attaches to a GPU kernel or a CPU thunk). Device timelines (/device:...)
    when the trace has any with such events, else the host's (a CPU run). Percentages are of all
    such events' time on the timelines read. ValueError when the trace names no operation."""
    import jax

    data = jax.profiler.ProfileData.from_file(trace)
    by_place: dict[str, dict[tuple[str, str], list[float]]] = {"device": defaultdict(lambda: [0.0, 0]),
                                                               "host": defaultdict(lambda: [0.0, 0])}
    for plane in data.planes:
        place = "device" if plane.name.startswith("/device:") else "host"
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" not in stats:
                    continue
                total = by_place[place][(str(stats["hlo_op"]), str(stats.get("hlo_module", "")))]
                total[0] += event.duration_ns / 1e3
                total[1] += 1
    where = "device" if by_place["device"] else "host"
    ops = by_place[where]
    if not ops:
        raise ValueError(f"{trace}: no event names an XLA operation (hlo_op); is it a jax profiler trace "
                         "taken while a jitted function ran?")
    total_us = sum(us for us, _ in ops.values()) or 1.0
    ranked = sorted(ops.items(), key=lambda item: -item[1][0])[:top]
    return [{"op": op, "module": module, "self_us": round(us, 1), "percent": round(100 * us / total_us, 2),
             "count": count} for (op, module), (us, count) in ranked], where
