"""`flaxheads serve`: an HTTP server for trained flaxheads models, on Starlette and uvicorn.

    flaxheads serve out/ --port 8080
    curl -s localhost:8080/predict -H 'Content-Type: application/json' -d '{"inputs": "a fine film"}'

Every model folder is opened as `flaxheads predict` opens it (an incomplete, unexported or
untrained one is refused before the port opens), its task's pipeline built over it, and every
shape its batches can take compiled before the server listens, so /health answers only when no
request will wait for a compilation. Routes and answers: `app.py`; batching: `batching.py`;
what each task answers: `models.py`. docs/serving.md is the user's guide.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ModuleNotFoundError as missing:  # the `serve` extra is optional
    raise ModuleNotFoundError(f"flaxheads serve needs {missing.name}: pip install 'flaxheads[serve]' (starlette, "
                              "uvicorn, prometheus_client)") from missing

from flaxheads.serving.app import Server, build_app  # noqa: E402 - after the check of the extra
from flaxheads.serving.models import ServedModel, open_served

DEFAULTS = dict(max_batch_tokens=16384, max_concurrent_requests=512, max_client_batch_size=32, payload_limit=2_000_000)
"""The limits' defaults (text-embeddings-inference's, where it has the limit)."""


def open_models(model_dirs: Sequence[str | os.PathLike], *, max_batch_tokens: int = DEFAULTS["max_batch_tokens"],
                max_input_length: int | None = None, packing: bool = True, warm: bool = True,
                log=None) -> list[ServedModel]:
    """Each of `model_dirs` (a folder, or NAME=FOLDER to serve it under another name than the
    folder's) opened to serve and, with `warm`, every shape of its batches compiled. ValueError for
    two models of one name, and as `open_served` refuses a folder. `packing`: text classifiers score
    short inputs packed several to a row (`open_served`)."""
    if not model_dirs:
        raise ValueError("serve needs at least one model folder: flaxheads serve MODEL_DIR [MODEL_DIR ...]")
    named = [_name_and_folder(str(given)) for given in model_dirs]
    names = [name for name, _ in named]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"two models would be served as {repeated[0]!r}: give each its own name, e.g. "
                         f"{repeated[0]}_2=<folder>")
    models = []
    for name, folder in named:
        started = time.perf_counter()
        model = open_served(folder, name=name, max_batch_tokens=max_batch_tokens, max_input_length=max_input_length,
                            packing=packing)
        calls = model.warm() if warm else 0
        if log is not None:
            log(f"{name}: {model.task} from {folder}, inputs up to {model.max_input_length} tokens, "
                f"{model.batch_size} a forward pass; {calls} shapes compiled, ready in "
                f"{time.perf_counter() - started:.1f} s")
        models.append(model)
    return models


def _name_and_folder(given: str) -> tuple[str, str]:
    name, sep, folder = given.partition("=")
    if sep and name and "/" not in name and not Path(given).exists():
        return name, folder
    return Path(given).name or given, given


def serve(model_dirs: Sequence[str | os.PathLike], *, host: str = "127.0.0.1", port: int = 8080,
          max_batch_tokens: int = DEFAULTS["max_batch_tokens"],
          max_concurrent_requests: int = DEFAULTS["max_concurrent_requests"],
          max_client_batch_size: int = DEFAULTS["max_client_batch_size"],
          payload_limit: int = DEFAULTS["payload_limit"],
          max_input_length: int | None = None, packing: bool = True, graceful_timeout: float = 30.0,
          log_level: str = "warning") -> None:
    """Serves `model_dirs` on http://`host`:`port` until SIGTERM or ctrl-C, which stop new
    connections and let the requests in flight finish (up to `graceful_timeout` s) before it
    returns. Batches hold up to `max_batch_tokens` padded tokens; beyond `max_concurrent_requests`
    requests in flight the server answers 429; a request holds at most `max_client_batch_size`
    inputs and `payload_limit` bytes. Raises ValueError (UntrainedModel) for a folder
    `flaxheads predict` would refuse, before the port opens. `max_input_length`: the most tokens
    an input may have (None: each model's limit; fewer shapes to compile ahead). `packing`: text
    classifiers score their short inputs packed several to a row (same answers, less padding;
    docs/serving.md)."""
    import uvicorn

    for name, value in dict(max_batch_tokens=max_batch_tokens, max_concurrent_requests=max_concurrent_requests,
                            max_client_batch_size=max_client_batch_size, payload_limit=payload_limit).items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: give a positive int")

    def log(message: str) -> None:
        print(f"flaxheads serve: {message}", file=sys.stderr, flush=True)

    models = open_models(model_dirs, max_batch_tokens=max_batch_tokens, max_input_length=max_input_length,
                         packing=packing, log=log)
    server = Server(models, max_batch_tokens=max_batch_tokens, max_concurrent_requests=max_concurrent_requests,
                    max_client_batch_size=max_client_batch_size, payload_limit=payload_limit)

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if not self.should_exit:
                log(f"ready on http://{host}:{port} ({', '.join(server.models)})")

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                # uvicorn raises a captured signal again once it has shut down, and the process
                # would end killed by it; SIGTERM's drain is the normal end here: exit status 0.
                self._captured_signals.remove(sig)

    config = uvicorn.Config(build_app(server), host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=graceful_timeout, lifespan="on")
    _Server(config).run()
    log("stopped")


__all__ = ["DEFAULTS", "Server", "ServedModel", "build_app", "open_models", "open_served", "serve"]
