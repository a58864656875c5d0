"""One batch run to its end on this process's engine: validate, run the lines not yet written, finalize.

The status machine (OpenAI's Batch): validating -> in_progress (request_counts.total set) ->
finalizing -> completed; a bad input file -> failed (errors listed; a file whose reading raises fails the
same way, at once, not on every run a heartbeat hands on); POST .../cancel ->
cancelling, then here cancelled with the lines written so far; past `expires_at` -> expired,
the lines not run written to the error file as batch_expired. Lines run at most
`batch_max_num_seqs` at a time (the engine's cap on batch sequences), each through
lines.run_line; each result is written as it ends (store.record_result, once per custom_id),
so a batch resumed after its worker died runs only the lines it had not written. The caller
owns the batch (execution.claim) while this runs.
"""
from __future__ import annotations

import asyncio
import logging

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from inference.operations import runtime
from inference.engine.outputs import EngineOverloaded
from inference.serving.prepare import cpu_work

from . import execution, store
from .lines import Invalid, Line, output_line, parse_input, run_line
from .models import Batch, Status

log = logging.getLogger("metrale.batches")

OVERLOADED_RETRY_S = 0.5


def db(fn, *args, **kwargs):
    """Run synchronous ORM work on the runner's own database thread."""
    return sync_to_async(fn)(*args, **kwargs)


def _read_input(batch: Batch) -> bytes | None:
    row = store.StoredFile.objects.filter(pk=batch.input_file_id, tenant_id=batch.tenant_id).first()
    if row is None:
        return None
    with row.content.open("rb") as f:
        return f.read()


def _status(batch_id: str) -> str:
    return Batch.objects.values_list("status", flat=True).get(pk=batch_id)


def _quota_error() -> dict:
    quota = settings.METRALE["BATCH_TOKENS_PER_DAY"]
    return {"error": {"message": f"This tenant's batch token quota ({quota} tokens per day) is used up; "
                                 "the line was not run.", "type": "tokens", "param": None,
                      "code": "batch_token_quota_exceeded"}}


EXPIRED = {"code": "batch_expired", "message": "This request could not be executed before the completion window "
                                           "expired."}


class BatchRun:
    """The run of one claimed batch on `registry`'s models (operations/registry.ModelRegistry): each line on
    the model its `model` names."""

    def __init__(self, batch: Batch, registry):
        self.batch = batch
        self.registry = registry
        self.stopped: str | None = None  # "cancelling", "expired" or "shutdown" once the run must stop
        self.concurrency = runtime.engine_config().batch_max_num_seqs

    async def run(self) -> str:
        """Run to a terminal status; returns it."""
        b = self.batch
        data = await db(_read_input, b)
        if data is None:
            await db(store.transition, b.id, Status.FAILED, only_from=store.ACTIVE,
                     errors=[{"code": "invalid_input_file", "line": None, "param": "input_file_id",
                              "message": f"The input file {b.input_file_id} no longer exists."}])
            return Status.FAILED
        try:
            lines = await cpu_work(parse_input, data, b.endpoint)
        except Invalid as exc:
            await db(store.transition, b.id, Status.FAILED, only_from=(Status.VALIDATING,), errors=exc.errors)
            return await db(_status, b.id)
        except Exception:
            if execution.stopping.is_set():
                raise  # the process is going: the next owner reads the file again
            # Reading a file gives the same answer every time: a raise here would recur on every run the
            # heartbeats hand on, so the batch fails now (the cause in the log; the client told the file is at fault).
            log.exception("batch %s: reading its input file raised; the batch fails", b.id)
            await db(store.transition, b.id, Status.FAILED, only_from=(Status.VALIDATING,), errors=[
                {"code": "invalid_input_file", "line": None, "param": "input_file_id",
                 "message": f"The input file {b.input_file_id} could not be read as batch lines."}])
            return await db(_status, b.id)
        model = str(lines[0].body.get("model") or "")[:200]
        await db(store.transition, b.id, Status.IN_PROGRESS, only_from=(Status.VALIDATING,), total=len(lines),
                 model=model)
        status = await db(_status, b.id)
        if status == Status.IN_PROGRESS:
            await self._run_lines(lines)
        if self.stopped == "shutdown":
            return await db(_status, b.id)  # unfinished: the next owner goes on from here
        return await self._finish(lines)

    async def _watch(self, tasks: list[asyncio.Task]) -> None:
        """Every BATCH_POLL_S (at once on shutdown): stop the run, cancelling its lines in flight,
        once the batch is cancelling or past its deadline, or the process shuts down."""
        while True:
            await asyncio.to_thread(execution.stopping.wait, settings.METRALE["BATCH_POLL_S"])
            status = await db(_status, self.batch.id)
            if execution.stopping.is_set():
                self.stopped = "shutdown"
            elif status == Status.CANCELLING:
                self.stopped = "cancelling"
            elif timezone.now() >= self.batch.deadline_at:
                self.stopped = "expired"
            if self.stopped:
                for task in tasks:
                    task.cancel()
                return

    async def _run_lines(self, lines: list[Line]) -> None:
        done = await db(store.done_custom_ids, self.batch.id)
        todo = iter([line for line in lines if line.custom_id not in done])
        tasks = [asyncio.create_task(self._work(todo)) for _ in range(self.concurrency)]
        watcher = asyncio.create_task(self._watch(tasks))
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            watcher.cancel()
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def _work(self, todo) -> None:
        b, quota = self.batch, settings.METRALE["BATCH_TOKENS_PER_DAY"]
        for line in todo:
            if self.stopped or execution.stopping.is_set():
                self.stopped = self.stopped or "shutdown"
                return
            if timezone.now() >= b.deadline_at:
                self.stopped = "expired"
                return
            if quota and await db(store.tokens_used_today, b.tenant_id) >= quota:
                result = (429, None, _quota_error(), None)
            else:
                while True:
                    try:
                        result = await run_line(b.endpoint, line, self.registry, tenant=b.tenant,
                                                cache_salt=b.tenant.prefix_cache_salt)
                        break
                    except EngineOverloaded:
                        await asyncio.sleep(OVERLOADED_RETRY_S)
            status_code, request_id, body, usage = result
            await db(store.record_result, b, line.custom_id, line.number, status_code != 200,
                     output_line(line.custom_id, status_code, request_id, body), usage)

    async def _finish(self, lines: list[Line]) -> str:
        b = self.batch
        status = await db(_status, b.id)
        if self.stopped == "expired" or (status == Status.IN_PROGRESS and timezone.now() >= b.deadline_at):
            done = await db(store.done_custom_ids, b.id)
            for line in lines:
                if line.custom_id not in done:
                    await db(store.record_result, b, line.custom_id, line.number, True,
                             output_line(line.custom_id, error=EXPIRED), None)
            await db(self._files)
            await db(store.transition, b.id, Status.EXPIRED, only_from=(Status.IN_PROGRESS, Status.CANCELLING))
        elif status == Status.CANCELLING:
            await db(self._files)
            await db(store.transition, b.id, Status.CANCELLED, only_from=(Status.CANCELLING,))
        elif status in (Status.IN_PROGRESS, Status.FINALIZING):
            await db(store.transition, b.id, Status.FINALIZING, only_from=(Status.IN_PROGRESS,))
            await db(self._files)
            await db(store.transition, b.id, Status.COMPLETED, only_from=(Status.FINALIZING,))
        return await db(_status, b.id)

    def _files(self) -> None:
        self.batch.refresh_from_db()
        store.write_files(self.batch)


async def run_batch(batch_id: str, registry) -> str:
    """Run the (claimed) batch `batch_id` to its end on `registry`'s models; its final status. The run's
    database work happens on a thread of its own."""
    async with ThreadSensitiveContext():
        try:
            batch = await db(Batch.objects.select_related("tenant").get, pk=batch_id)
            if batch.status in (Status.VALIDATING, Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING):
                return await BatchRun(batch, registry).run()
            return batch.status
        finally:
            await db(close_old_connections)
