"""What `BatchStore.update` may set (`BatchFields`), as the stores write it; the run summary in its own field,
read from older records that kept it among the routes."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.domain import BatchStatus
from gateway.store.records import BatchFields, BatchRecord, RequestCounts, batch_fields


@pytest.mark.parametrize(("fields", "written"), [
    ({"status": BatchStatus.CANCELLING, "cancelling_at": 5}, {"status": "cancelling", "cancelling_at": 5}),
    ({"counts": RequestCounts(total=3), "model": None, "shards_total": 2},
     {"counts": {"total": 3, "completed": 0, "failed": 0}, "model": None, "shards_total": 2}),
    ({"routes": {"m": {"requests": 1}}, "summary": {"failed": 0}},
     {"routes": {"m": {"requests": 1}}, "summary": {"failed": 0}}),
    ({}, {}),
])
def test_batch_fields_as_written(fields: BatchFields, written: dict[str, Any]) -> None:
    assert batch_fields(fields) == written


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(TypeError, match="not an updatable batch field: id, modle"):
        batch_fields({"modle": "m", "id": "batch_x"})  # type: ignore[typeddict-unknown-key]


def _record(**extra: Any) -> dict[str, Any]:
    rec = BatchRecord(id="batch_1", owner="", endpoint="/v1/chat/completions", input_file_id="file_1",
                      completion_window="24h", status=BatchStatus.COMPLETED, created_at=1, expires_at=2)
    return {**rec.to_json(), **extra}


@pytest.mark.parametrize(("stored", "routes", "summary"), [
    (_record(), {}, None),
    (_record(routes={"m": {"requests": 2}}, summary={"failed": 1}), {"m": {"requests": 2}}, {"failed": 1}),
    # before the summary had a field it was a route named "summary"
    (_record(routes={"m": {"requests": 2}, "summary": {"failed": 1}}), {"m": {"requests": 2}}, {"failed": 1}),
    ({k: v for k, v in _record(routes={"summary": {"failed": 1}}).items() if k != "summary"}, {}, {"failed": 1}),
])
def test_the_summary_is_read_apart_from_the_routes(stored: dict[str, Any], routes: dict[str, Any],
                                                    summary: dict[str, Any] | None) -> None:
    rec = BatchRecord.from_json(stored)
    assert (rec.routes, rec.summary) == (routes, summary)
    assert rec.to_openai()["routes"] == routes
