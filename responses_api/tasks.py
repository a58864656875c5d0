"""Celery tasks of the Responses app: housekeeping of stored items."""

from celery import shared_task

from . import store


@shared_task(name="responses_api.tasks.purge_expired")
def purge_expired() -> dict:
    """Delete stored responses, conversations and chat completions older than
    METRALE["STORE_TTL_S"], and mark failed any unfinished response whose process is gone.
    Returns the counts.

    Scheduled by CELERY_BEAT_SCHEDULE with a broker; without one the server's housekeeping
    thread (housekeeping.py) calls it in-process.
    """
    failed = store.fail_unfinished()
    return {**store.purge_expired(), "failed_unfinished": failed}
