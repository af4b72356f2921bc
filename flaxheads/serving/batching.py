"""Dynamic batching: one queue per model, drained by one worker thread that runs the model.

Requests join the queue as they come; whenever the worker is free it takes the oldest request
and every request queued behind it that shares its options (`Work.key`) while their padded tokens
fit `max_batch_tokens`, runs them as one call of the pipeline, and hands each request its own
answers. While a batch runs, the next one gathers: no timer holds a lone request back.
A request whose client went away before its batch started is dropped without running.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any, Awaitable, Callable

from flaxheads.serving.models import ServedModel, Work
from flaxheads.serving.requests import ClientError


class _Job:
    __slots__ = ("work", "future", "loop", "queued_at")

    def __init__(self, work: Work, future: asyncio.Future, loop: asyncio.AbstractEventLoop):
        self.work, self.future, self.loop, self.queued_at = work, future, loop, time.perf_counter()


class Batcher:
    """The queue and worker thread of one served model. `observe(batch_items, batch_tokens,
    queue_size)` is called after each batch (the server's metrics)."""

    def __init__(self, model: ServedModel, max_batch_tokens: int,
                 observe: Callable[[int, int, int], None] | None = None):
        self.model, self.max_batch_tokens, self.observe = model, max_batch_tokens, observe
        self._queue: collections.deque[_Job] = collections.deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"flaxheads-serve-{model.name}", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return len(self._queue)

    async def submit(self, work: Work, disconnected: Awaitable | None = None) -> Any:
        """The JSON answer of `work`, once its batch has run; raises ClientError for an input the
        pipeline refuses (the request's own error: its batch mates are answered), and ClientGone
        when `disconnected` (an awaitable that ends when the client goes away) ends first: the
        request then leaves the queue, or its answer is dropped."""
        loop = asyncio.get_running_loop()
        job = _Job(work, loop.create_future(), loop)
        with self._ready:
            self._queue.append(job)
            self._ready.notify()
        if disconnected is None:
            return work.finish(await job.future)
        watcher = asyncio.ensure_future(disconnected)
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.future.done():
            job.future.cancel()  # the worker skips it, or drops the answer of its running batch
            raise ClientGone()
        return work.finish(job.future.result())

    def stop(self) -> None:
        """Ends the worker once the queue is empty (the server drains first)."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join()

    def _next_batch(self) -> list[_Job] | None:
        with self._ready:
            while not self._queue and not self._stopping:
                self._ready.wait()
            if not self._queue:
                return None
            batch = [self._queue.popleft()]
            tokens = batch[0].work.tokens
            while self._queue and self._queue[0].work.key == batch[0].work.key \
                    and tokens + self._queue[0].work.tokens <= self.max_batch_tokens:
                tokens += self._queue[0].work.tokens
                batch.append(self._queue.popleft())
            return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [job for job in batch if not job.future.cancelled()]  # the client went away
            if not batch:
                continue
            self._run(batch)
            if self.observe is not None:
                self.observe(sum(len(job.work.items) for job in batch), sum(job.work.tokens for job in batch),
                             len(self._queue))

    def _run(self, batch: list[_Job]) -> None:
        items = [item for job in batch for item in job.work.items]
        try:
            answers = self.model.run(batch[0].work.key, items)
        except Exception as err:  # noqa: BLE001 - each request gets its own answer or error
            if len(batch) > 1:  # one request's input failed the batch: run each alone, so only it fails
                for job in batch:
                    self._run([job])
                return
            _resolve(batch[0], error=_as_client_error(err))
            return
        start = 0
        for job in batch:
            count = len(job.work.items)
            _resolve(job, answers=answers[start:start + count])
            start += count


class ClientGone(ClientError):
    """The client disconnected before its answer was ready (nginx's 499: no one reads it)."""

    def __init__(self):
        super().__init__(499, "the client disconnected before its answer was ready", "client_gone")


def _as_client_error(err: Exception) -> Exception:
    """A pipeline's ValueError is about the input (422, its message names the fix); a
    FloatingPointError or anything else is the model's or the server's fault (424, as
    text-embeddings-inference answers an inference failure)."""
    if isinstance(err, ClientError):
        return err
    if isinstance(err, ValueError):
        return ClientError(422, str(err))
    return ClientError(424, f"inference failed: {type(err).__name__}: {err}", "backend")


def _resolve(job: _Job, *, answers: list | None = None, error: Exception | None = None) -> None:
    def settle():
        if job.future.done():  # cancelled meanwhile
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(answers)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits for the answer
        pass
