"""Celery tasks of the Batch API: one task runs one batch on the worker's engine."""
from __future__ import annotations

from celery import shared_task


@shared_task(name="batches.tasks.run_batch", acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(Exception,), retry_backoff=5, retry_backoff_max=300, max_retries=20)
def run_batch(batch_id: str) -> str | None:
    """Run the batch `batch_id` on this worker's engine (execution.run_here); its final status,
    None when a live process owns it already. Acknowledged only when it returns, and given to
    another worker if this one dies mid-batch: that one runs only the lines not yet written. A run
    that raises (the database away, the model not loading) is retried later, with a backoff."""
    from .execution import run_here

    return run_here(batch_id)
