"""A repeated custom_id is found at flat memory (`SeenIds`), with the same answer at any file size.

- Past `spill_after` ids the ids move to a temporary SQLite database; a repeat there gets the error (code,
  message, 1-based line, param) and the run_batch warning's line that a small file gets.
- Two ids that share a hash are two ids: the text decides, never the hash alone.
- The database's file has no name from the moment it is open (a killed process leaves nothing behind), and
  its descriptor is closed when validation ends, an early stop included.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint
from gateway.errors import LineCode, LineError
from gateway.pipeline.plan import Planner
from gateway.pipeline.seen_ids import SeenIds
from gateway.pipeline.validate import LineChecker
from gateway.store.blobs.directory import LocalBlobs
from tests.support.services import shared_config

CONFIG = parse_config(shared_config("http://127.0.0.1:9/v1", ("gpt-mini",), shard_size=3))


def _line(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": "hi"}]}}).encode()


def _open_in(directory: Path) -> list[str]:
    """The files of `directory` this process holds open (a deleted one too: Linux names it '... (deleted)')."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            held.append(target)
    return held


def _check_all(checker: LineChecker, ids: list[str]) -> list[BatchRequest | LineError | object]:
    return [checker.check(_line(custom_id), line) for line, custom_id in enumerate(ids, start=1)]


def test_a_repeat_past_the_spill_gets_the_same_error_as_one_below_it(tmp_path: Path) -> None:
    ids = [f"req-{i}" for i in range(40)] + ["req-7"]  # line 41 repeats line 8
    errors = []
    for spill_after in (1_000, 5):  # all in memory; on disk after 5 ids (and in batches of writes after)
        seen = SeenIds(spill_after=spill_after, directory=str(tmp_path))
        checker = LineChecker(CONFIG, endpoint=Endpoint.CHAT, allowed_models=None, seen=seen)
        checked = _check_all(checker, ids)
        assert seen.on_disk is (spill_after == 5)
        assert all(isinstance(c, BatchRequest) for c in checked[:-1])
        errors.append(checked[-1])
        checker.close()
    assert errors[0] == errors[1] == LineError(LineCode.DUPLICATE_CUSTOM_ID, "custom_id 'req-7' appears more than once",
                                               41, "custom_id")


def test_run_batch_rules_warn_of_the_same_first_repeat_past_the_spill(tmp_path: Path) -> None:
    ids = [f"req-{i}" for i in range(30)] + ["req-3", "req-29", "req-3"]
    seen = SeenIds(spill_after=4, directory=str(tmp_path))
    checker = LineChecker(CONFIG, endpoint=None, allowed_models=None, allow_duplicates=True, seen=seen)
    checked = _check_all(checker, ids)
    assert seen.on_disk and all(isinstance(c, BatchRequest) for c in checked)  # answered line by line
    assert (checker.repeats, checker.first_repeat) == (3, ("req-3", 31))
    checker.close()


def test_ids_sharing_a_hash_are_not_a_repeat(tmp_path: Path) -> None:
    seen = SeenIds(spill_after=2, hash_id=lambda _: 0, directory=str(tmp_path))  # every id collides
    assert [seen.add(f"id-{i}") for i in range(10)] == [False] * 10
    assert seen.on_disk
    assert seen.add("id-0") and seen.add("id-9") and not seen.add("id-10")
    seen.close()


def test_the_database_file_is_nameless_while_open_and_freed_by_close(tmp_path: Path) -> None:
    seen = SeenIds(spill_after=3, directory=str(tmp_path))
    for i in range(5):
        seen.add(f"id-{i}")
    assert seen.on_disk
    assert os.listdir(tmp_path) == []  # unlinked as soon as it was opened: a kill leaves nothing
    held = _open_in(tmp_path)
    assert len(held) == 1 and held[0].endswith("(deleted)")
    seen.close()
    assert _open_in(tmp_path) == [] and not seen.on_disk


async def _lines(ids: list[str], tail: list[bytes]) -> AsyncIterator[bytes]:
    for custom_id in ids:
        yield _line(custom_id)
    for raw in tail:
        yield raw


async def test_a_plan_that_stops_early_leaves_no_database_behind(tmp_path: Path) -> None:
    directory = tmp_path / "tmp"
    directory.mkdir()
    ids = [f"req-{i}" for i in range(20)]
    for tail, max_lines in (([_line("req-2")], None), ([], 10)):  # a failed file; a file past its line limit
        seen = SeenIds(spill_after=4, directory=str(directory))
        planner = Planner(CONFIG, LocalBlobs(tmp_path / "blobs"), "batch_s", "files/in", endpoint=Endpoint.CHAT,
                          strict=True, allowed_models=None, max_lines=max_lines, seen=seen)
        outcome = await planner.plan(_lines(ids, tail))
        assert outcome.failed
        code = LineCode.DUPLICATE_CUSTOM_ID if max_lines is None else LineCode.TOO_MANY_TASKS
        assert [(e.code, e.line) for e in outcome.errors] == [(code, 21 if max_lines is None else 11)]
        assert not seen.on_disk and _open_in(directory) == [] and os.listdir(directory) == []
