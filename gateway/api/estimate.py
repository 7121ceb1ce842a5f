"""`GET /v1/files/{file_id}/cost_estimate` (our extension): what a batch of the caller's file would cost, per
model and in total, and the validation errors it would hit; nothing is sent (`gateway.estimate.cost`).

The file is read as validation reads it: streamed, in one of the validation processes where the runtime has
them (`batchyard serve`), so the CPU work never holds the API's event loop; else in threads. Those processes
are every team's batches' too: a team runs at most `batch_settings.max_estimates_per_team` estimates at once
(per API process; past it 429 `too_many_estimates`), so that one team's estimates never queue ahead of
another team's validation for long.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.api.deps import Caller, check_id, runtime_of
from gateway.api.http_errors import ApiError
from gateway.config.urls import normalise_endpoint
from gateway.domain import Endpoint
from gateway.errors import InvalidRequest, invalid_value, not_found
from gateway.estimate.cost import Estimate, EstimateJob, estimate_file

router = APIRouter()

_TRIES = 2  # a validation process that died (killed, out of memory) is replaced once


@contextmanager
def _slot(request: Request, team: str) -> Iterator[None]:
    """One of the team's estimate slots on this process, or 429 `too_many_estimates`."""
    running: collections.Counter[str] | None = getattr(request.app.state, "estimates", None)
    if running is None:
        running = request.app.state.estimates = collections.Counter()
    limit = runtime_of(request).config.batch.max_estimates_per_team
    if running[team] >= limit:
        raise ApiError(429, f"Too many cost estimates running for team {team!r}: at most {limit} at once "
                            "(batch_settings.max_estimates_per_team). Try again once one has answered.",
                       code="too_many_estimates")
    running[team] += 1
    try:
        yield
    finally:
        running[team] -= 1


@router.get("/files/{file_id}/cost_estimate")
async def cost_estimate(request: Request, caller: Caller, file_id: str, endpoint: str | None = None) -> JSONResponse:
    runtime = runtime_of(request)
    rec = await runtime.store.files.get(check_id(file_id, "file", "file_id"), caller.owner)
    if rec is None:  # another team's file too: the same 404
        raise not_found("file", file_id, "id")
    if rec.purpose != "batch":
        raise InvalidRequest(f"file {file_id} has purpose {rec.purpose!r}, not 'batch'", param="file_id",
                             code="invalid_file")
    wanted = None
    if endpoint is not None:  # the batch's endpoint, when the caller knows it: lines of another url are errors
        wanted = normalise_endpoint(endpoint)
        if wanted is None:
            raise invalid_value(endpoint, [e.value for e in Endpoint], "endpoint")
    job = EstimateJob(rec.blob_key, caller.allowed_models, wanted)
    estimate: Estimate | None = None
    with _slot(request, caller.owner):
        for _ in range(_TRIES):
            try:
                if runtime.validation is not None:
                    estimate = await runtime.validation.estimate(job)
                else:
                    estimate = await estimate_file(runtime.config, runtime.blobs, job)
                break
            except BrokenProcessPool:
                continue
    if estimate is None:
        raise ApiError(503, "The estimate could not be made now; try again.", code="estimate_unavailable")
    return JSONResponse({"file_id": rec.id, **estimate.to_json()})
