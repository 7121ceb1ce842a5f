"""Request spans leave through a helper process (`gateway.tracing.offload`), so that encoding tens of thousands
of them does not take the batch's own time: a batch through the embedded runtime in this process, traces
switched on by the standard variables, exported over OTLP/HTTP to a real receiver on loopback. The request
spans come out of the helper whole (ids, parent, attributes, status, this process's resource); with the
helper gone they still come out, from this process; a forked process never writes to its parent's helper; and
the helper ends with the tracing that started it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import tracing
from gateway.config.schema import parse_config
from gateway.runtime.runtime import Runtime
from gateway.tracing import genai
from gateway.tracing.offload import OffloadedSpans
from gateway.tracing.switch import STATE
from tests.fakes.otlp_receiver import OTLPReceiver, receiving
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import chat_line, embedded_runtime, gateway_config, run_embedded_batch
from tests.support.waiting import eventually

MODEL = "gpt-mini"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(api_key="sk-traces") as up:
        yield up


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    with receiving(monkeypatch) as rec:
        yield rec
        tracing.shutdown()


def _config(upstream: Upstream) -> Any:
    return parse_config(gateway_config(upstream, models=(MODEL,), teams=[{"team_id": "alpha",
                                                                           "api_keys": ["sk-alpha"]}],
                                       shard_size=3))


async def _run_batch(runtime: Runtime, prefix: str, n: int, failing: tuple[int, ...] = ()) -> None:
    lines = [chat_line(f"{prefix}{i}", MODEL, f"hello {i}" + (" #fail:500" if i in failing else ""))
             for i in range(n)]
    await run_embedded_batch(runtime, "alpha", lines)


def _offload() -> OffloadedSpans:
    assert STATE.offload is not None, "OTLP tracing hands request spans to a helper"
    return STATE.offload


def _requests(receiver: OTLPReceiver, n: int) -> list[Any]:
    return eventually(lambda: (found if len(found := receiver.named(f"chat {MODEL}")) >= n else None), 30,
                      f"{n} request spans at the receiver")


async def test_request_spans_leave_whole_through_a_helper_process(upstream: Upstream, receiver: OTLPReceiver,
                                                                 tmp_path: Path) -> None:
    assert tracing.configure("worker")
    assert _offload().pid is None  # no helper before the first request span (an API process never has one)
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        await _run_batch(runtime, "a", 7, failing=(3,))
    helper = _offload().pid
    assert helper is not None and helper != os.getpid()
    tracing.flush()
    requests = _requests(receiver, 7)
    assert sorted(s.attributes[genai.CUSTOM_ID] for s in requests) == [f"a{i}" for i in range(7)]
    shards = {s.span_id: s for s in receiver.named("batch.shard")}  # made and exported in this process
    for span in requests:
        shard = shards[span.parent_span_id]
        assert span.trace_id == shard.trace_id and span.kind == "CLIENT"
        assert span.resource == shard.resource  # this process's: role, service.instance.id
        assert span.resource["batchyard.role"] == "worker"
    [failed] = [s for s in requests if s.attributes[genai.CUSTOM_ID] == "a3"]
    assert failed.status == 2 and failed.attributes[genai.HTTP_STATUS] == 500
    assert {s.status for s in requests if s is not failed} == {0}
    assert all(s.attributes[genai.INPUT_TOKENS] > 0 for s in requests if s is not failed)
    tracing.shutdown()  # the helper exports what it holds and ends
    assert eventually(lambda: not _pid_alive(helper) or None, 10, "the helper's end")


async def test_with_the_helper_gone_request_spans_are_exported_from_this_process(
        upstream: Upstream, receiver: OTLPReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert tracing.configure("worker")
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        await _run_batch(runtime, "before", 3)
        tracing.flush()
        helper = _offload().pid
        assert helper is not None
        os.kill(helper, signal.SIGKILL)
        eventually(lambda: _offload().pid is None or None, 10, "the helper's death")
        with caplog.at_level(logging.WARNING, logger="batchyard.tracing"):
            await _run_batch(runtime, "after", 3)
            tracing.flush()
    ids = sorted(s.attributes[genai.CUSTOM_ID] for s in _requests(receiver, 6))
    assert ids == ["after0", "after1", "after2", "before0", "before1", "before2"]
    assert "the span export process is gone" in caplog.text


async def test_a_forked_process_never_writes_to_its_parents_helper(upstream: Upstream, receiver: OTLPReceiver,
                                                                  tmp_path: Path) -> None:
    assert tracing.configure("worker")
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        await _run_batch(runtime, "first", 3)
        helper = _offload().pid
        pid = os.fork()
        if pid == 0:  # a forked child, with what it inherited: its spans must not reach the parent's pipe
            code = 0
            try:
                _offload().add((f"chat {MODEL}", 1, 2, 3, 1, "", 3, False, 0, 1, {genai.CUSTOM_ID: "forked"}))
                tracing.shutdown()
                tracing.configure("validation")  # its own tracing, set up over the inherited one
                tracing.shutdown()
            except BaseException:
                code = 1
            os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        assert _offload().pid == helper  # still the same helper, still running
        await _run_batch(runtime, "second", 3)
        tracing.flush()  # the helper has exported all it got, in order
    ids = sorted(s.attributes[genai.CUSTOM_ID] for s in _requests(receiver, 6))
    assert ids == ["first0", "first1", "first2", "second0", "second1", "second2"]


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
