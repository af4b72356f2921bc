"""The HTTP routes: text-embeddings-inference's where it has them (/predict, /rerank, /tokenize,
/health, /info, /metrics), and in the same style /token_classification, /question_answering,
/multiple_choice and /reward. Each inference route is also /models/<name>/<route>, and reads a
`model` field: either chooses one of several served models.

Errors are JSON {"error", "error_type"} (text-embeddings-inference's shape): 400 for a body that is
no JSON, 413 for a body, a batch or an input that is too large, 422 for a field of the wrong type
or value, 404 for an unknown model, 424 for a model that does not answer the route, 429 beyond
--max_concurrent_requests (499, counted but read by no one, for a client that went away). A
client's mistake is never a 500.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import jax
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flaxheads.serving.batching import Batcher, ClientGone
from flaxheads.serving.models import ServedModel
from flaxheads.serving.requests import ClientError, parse_body
from flaxheads.version import __version__

LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
"""What jax reports once per program it compiles (or reads from its persistent cache): a new shape."""
INFERENCE_ROUTES = ("predict", "rerank", "reward", "token_classification", "question_answering", "multiple_choice",
                    "tokenize")


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (several servers in one process
    do not share counts)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("flaxheads_requests", "Requests answered, by model, route and HTTP status",
                                ["model", "route", "status"], registry=self.registry)
        self.duration = Histogram("flaxheads_request_duration_seconds", "Time from a request's arrival to its answer",
                                  ["model", "route"], registry=self.registry)
        self.errors = Counter("flaxheads_errors", "Requests refused or failed, by kind (error_type)", ["kind"],
                              registry=self.registry)
        self.queue = Gauge("flaxheads_queue_size", "Requests waiting for a batch, by model", ["model"],
                           registry=self.registry)
        self.in_flight = Gauge("flaxheads_requests_in_flight", "Inference requests being answered",
                               registry=self.registry)
        self.batch_inputs = Histogram("flaxheads_batch_inputs", "Inputs per batch, by model", ["model"],
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=self.registry)
        self.compilations = Counter(
            "flaxheads_compilations", "XLA programs lowered while the server listens (each one a request waited for; "
            "0 when every shape was compiled before it listened)", registry=self.registry)
        self.batch_tokens = Histogram("flaxheads_batch_tokens", "Padded tokens per batch, by model", ["model"],
                                      buckets=tuple(2 ** i for i in range(4, 18)), registry=self.registry)

    def observer(self, model: str):
        def observe(inputs: int, tokens: int, queued: int) -> None:
            self.batch_inputs.labels(model).observe(inputs)
            self.batch_tokens.labels(model).observe(tokens)
            self.queue.labels(model).set(queued)
        return observe


class Server:
    """The state the routes share: the models, their batchers, the limits and the metrics."""

    def __init__(self, models: list[ServedModel], *, max_batch_tokens: int, max_concurrent_requests: int,
                 max_client_batch_size: int, payload_limit: int):
        self.models = {model.name: model for model in models}
        self.max_batch_tokens, self.max_concurrent_requests = max_batch_tokens, max_concurrent_requests
        self.max_client_batch_size, self.payload_limit = max_client_batch_size, payload_limit
        self.metrics = Metrics()
        self.batchers: dict[str, Batcher] = {}
        self.in_flight = 0
        self.draining = False

    def start(self) -> None:
        jax.monitoring.register_event_duration_secs_listener(self._count_compilation)
        for name, model in self.models.items():
            self.batchers[name] = Batcher(model, self.max_batch_tokens, self.metrics.observer(name))

    def stop(self) -> None:
        self.draining = True
        for batcher in self.batchers.values():
            batcher.stop()
        jax.monitoring.unregister_event_duration_listener(self._count_compilation)

    def _count_compilation(self, event: str, duration: float, **metadata) -> None:
        if event == LOWERING_EVENT:
            self.metrics.compilations.inc()

    def info(self) -> dict[str, Any]:
        models = [model.info() for model in self.models.values()]
        single = models[0] if len(models) == 1 else {}
        return {**{k: single[k] for k in ("model_id", "model_type", "max_input_length") if k in single},
                "version": f"flaxheads {__version__}", "max_concurrent_requests": self.max_concurrent_requests,
                "max_batch_tokens": self.max_batch_tokens, "max_client_batch_size": self.max_client_batch_size,
                "payload_limit": self.payload_limit, "models": models}

    def model_for(self, route: str, name: Any) -> ServedModel:
        """The model a request names (`name`: the `model` field or the path's), else the one
        served model that answers `route`."""
        if name is not None:
            if not isinstance(name, str) or name not in self.models:
                raise ClientError(404, f"no served model is called {name!r}; the server has "
                                       f"{', '.join(map(repr, self.models))} (GET /info lists them)", "not_found")
            model = self.models[name]
            if route not in model.routes:
                raise ClientError(424, f"{name} is a {model.task} model, which does not answer /{route}; it answers "
                                       f"{', '.join('/' + r for r in model.routes)}", "validation")
            return model
        answering = [model for model in self.models.values() if route in model.routes]
        if len(answering) == 1:
            return answering[0]
        if not answering:
            raise ClientError(424, f"no served model answers /{route}: the server has "
                                   f"{', '.join(f'{m.name} ({m.task})' for m in self.models.values())}", "validation")
        raise ClientError(422, f"several served models answer /{route} ({', '.join(m.name for m in answering)}): "
                               f"name one with the \"model\" field or POST /models/<name>/{route}")

    async def answer(self, request: Request, route: str) -> Response:
        started = time.perf_counter()
        model_name = request.path_params.get("model")
        if self.in_flight >= self.max_concurrent_requests:
            return self._error(ClientError(429, "Model is overloaded", "overloaded"), model_name, route)
        self.in_flight += 1
        self.metrics.in_flight.inc()
        try:
            body = parse_body(await self._body(request))
            if model_name is not None and body.get("model", model_name) != model_name:
                raise ClientError(422, f"the path names model {model_name!r} and the \"model\" field "
                                       f"{body['model']!r}: name it once")
            model = self.model_for(route, body.get("model", model_name))
            model_name = model.name
            if route == "tokenize":
                answer = model.tokenize(body, self.max_client_batch_size)
            else:
                work = model.work(route, body, self.max_client_batch_size)
                answer = await self.batchers[model.name].submit(work, _disconnected(request))
        except ClientError as err:
            return self._error(err, model_name, route)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
        self.metrics.requests.labels(model_name, route, "200").inc()
        self.metrics.duration.labels(model_name, route).observe(time.perf_counter() - started)
        return JSONResponse(answer)

    async def _body(self, request: Request) -> bytes:
        """The request's body; ClientError 413 past --payload_limit bytes (read no further)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.payload_limit:
            raise self._too_large(int(declared))
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.payload_limit:
                    raise self._too_large(len(body))
        except ClientDisconnect:
            raise ClientGone() from None
        return bytes(body)

    def _too_large(self, size: int) -> ClientError:
        return ClientError(413, f"the request body has {size} bytes, more than the {self.payload_limit} the server "
                                "reads (--payload_limit): send fewer or shorter inputs per request")

    def _error(self, err: ClientError, model: str | None, route: str) -> JSONResponse:
        self.metrics.errors.labels(err.error_type).inc()
        self.metrics.requests.labels(model or "", route, str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status)


async def _disconnected(request: Request) -> None:
    """Ends when the client of `request` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(server: Server) -> Starlette:
    """The Starlette application over `server` (its batchers start and stop with the app)."""

    def route_handler(route: str):
        async def handle(request: Request) -> Response:
            return await server.answer(request, route)
        return handle

    async def health(request: Request) -> Response:
        if server.draining:
            return JSONResponse({"error": "unhealthy", "error_type": "unhealthy"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def info(request: Request) -> Response:
        return JSONResponse(server.info())

    async def metrics(request: Request) -> Response:
        for name, batcher in server.batchers.items():
            server.metrics.queue.labels(name).set(len(batcher))
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == 405:
            message = f"{request.method} is not allowed on {request.url.path}: the inference routes take POST"
        else:
            message = (f"no route {request.url.path}; the server answers "
                       f"{', '.join('/' + r for r in ('health', 'info', 'metrics', *INFERENCE_ROUTES))}")
        return JSONResponse({"error": message, "error_type": "not_found"}, status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            server.stop()

    routes = [Route("/health", health, methods=["GET"]), Route("/info", info, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    for route in INFERENCE_ROUTES:
        routes.append(Route(f"/{route}", route_handler(route), methods=["POST"]))
        routes.append(Route(f"/models/{{model}}/{route}", route_handler(route), methods=["POST"]))
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
