"""Why a batch's requests must stop (`stop_reason`), and the error each unrun request then gets
(`StopReason`: a code and a message).

The runner, the finalizer, the sweeper and a native-batch backend (before each provider job it
commits) all ask it, so it sits below the backends as well as the pipeline.
"""

from __future__ import annotations

from gateway.domain import BatchStatus
from gateway.store.records import BatchRecord, now

StopReason = tuple[str, str]  # (error code, message) for each request that will not run
CANCELLED: StopReason = ("batch_cancelled", "The batch was cancelled before this request ran.")
EXPIRED: StopReason = ("batch_expired", "The batch expired before this request ran.")
LOST: StopReason = ("internal_error", "No result was recorded for this request.")
OVER_BUDGET: StopReason = ("budget_exceeded", "The team's budget (max_budget) was spent before this request ran.")

MAX_ATTEMPTS = 3  # a shard that failed (or killed its worker) this often is given up
GIVEN_UP: StopReason = (
    "shard_failed",
    f"The request's shard was attempted {MAX_ATTEMPTS} times and failed each time (a worker died or errored "
    "while running it); the request was not run again.",
)


def stop_reason(batch: BatchRecord) -> StopReason | None:
    """Why a batch's requests must not run any more, if they mustn't."""
    if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return CANCELLED
    if batch.expired_at is not None or now() >= batch.expires_at:
        return EXPIRED
    if batch.status.finished:
        return LOST
    return None


__all__ = ["CANCELLED", "EXPIRED", "GIVEN_UP", "LOST", "MAX_ATTEMPTS", "OVER_BUDGET", "StopReason", "stop_reason"]
