"""A reserving create's estimate is made while the file is stored (`gateway.runtime.create_estimates`).

For a team that reserves at create, storing one of its `batch` files starts the file's estimate, every line
counted; a create of the file holds that figure (it waits for the pass, it does not make one). A team that does
not reserve starts none, and a create whose file has no such estimate (or whose pass failed) makes its own for
its endpoint and models. Real config, real blobs on disk, the real estimate (LiteLLM's tokenizer); the file's
bytes are changed under the store after the pass to show which pass a create's figure came from."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus
from gateway.runtime.create_estimates import CreateEstimates
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.records import BatchOptions, BatchRecord, FileRecord
from tests.support.services import shared_config

TEAMS = [{"team_id": "reserving", "api_keys": ["sk-r"], "max_budget": 100.0, "budget_reservation": "estimate"},
         {"team_id": "plain", "api_keys": ["sk-p"], "max_budget": 100.0}]
RAW = shared_config("http://127.0.0.1:9/v1", ("gpt-mini",), teams=TEAMS)
RAW["model_list"][0]["model_info"] = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
CONFIG = parse_config(RAW)


def _lines(count: int, max_tokens: int = 100) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "gpt-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hello"}]},
    }).encode() + b"\n" for i in range(count))


def _file(blobs: LocalBlobs, owner: str, file_id: str, body: bytes) -> FileRecord:
    (blobs.root / file_id).write_bytes(body)
    return FileRecord(file_id, owner, len(body), 0, f"{file_id}.jsonl", "batch", None, file_id)


def _batch(owner: str, file_id: str) -> BatchRecord:
    return BatchRecord(id=f"batch_{file_id}", owner=owner, endpoint="/v1/chat/completions", input_file_id=file_id,
                       completion_window="24h", status=BatchStatus.VALIDATING, created_at=0, expires_at=0,
                       metadata=None, options=BatchOptions())


class Tasks:
    def __init__(self) -> None:
        self.names: list[str] = []

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        self.names.append(name)
        return asyncio.create_task(coro, name=name)


def _estimates(tmp_path: Path) -> tuple[CreateEstimates, LocalBlobs, Tasks]:
    blobs, tasks = LocalBlobs(tmp_path), Tasks()
    reserves = {"reserving": True, "plain": False}
    return CreateEstimates(CONFIG, blobs, None, reserves.__getitem__, tasks.spawn), blobs, tasks


def test_a_reserving_teams_create_holds_the_estimate_made_when_its_file_was_stored(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float, list[str]]:
        estimates, blobs, tasks = _estimates(tmp_path)
        source = _file(blobs, "reserving", "file-a", _lines(10))
        estimates.file_stored(source)
        stored = await estimates.cost(_batch("reserving", "file-a"), source)
        (blobs.root / "file-a").write_bytes(_lines(1))  # a create's own pass would now see one line
        again = await estimates.cost(_batch("reserving", "file-a"), source)
        return stored, again, tasks.names

    stored, again, names = asyncio.run(scenario())
    assert names == ["estimate-file-a"]
    assert stored == again > 10 * 100 * 2e-6  # ten lines' output bound at least: the pass made at store time


def test_no_pass_for_a_team_that_does_not_reserve_and_a_create_without_one_makes_its_own(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float, list[str]]:
        estimates, blobs, tasks = _estimates(tmp_path)
        source = _file(blobs, "plain", "file-p", _lines(10))
        estimates.file_stored(source)
        ten = await estimates.cost(_batch("plain", "file-p"), source)
        (blobs.root / "file-p").write_bytes(_lines(1))
        one = await estimates.cost(_batch("plain", "file-p"), source)
        return ten, one, tasks.names

    ten, one, names = asyncio.run(scenario())
    assert names == []
    assert one < ten and abs(ten - 10 * one) < 1e-9


def test_a_pass_that_failed_when_the_file_was_stored_is_made_again_at_create(tmp_path: Path) -> None:
    async def scenario() -> float:
        estimates, blobs, _ = _estimates(tmp_path)
        source = FileRecord("file-late", "reserving", 0, 0, "late.jsonl", "batch", None, "file-late")
        estimates.file_stored(source)  # its bytes are not there yet: the pass fails
        await asyncio.sleep(0.1)
        (blobs.root / "file-late").write_bytes(_lines(3))
        return await estimates.cost(_batch("reserving", "file-late"), source)

    assert asyncio.run(scenario()) > 3 * 100 * 2e-6
