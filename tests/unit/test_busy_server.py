"""A busy server's load and a background route's shared concurrency: the rules of gateway.scheduling.busy_server."""

from __future__ import annotations

import pytest

from gateway.scheduling.busy_server import Aimd, ServerLoad, ShareAsk, exchange, read_load

SCRAPE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="other"} 30.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting{engine="0",model_name="other"} 9.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0
"""


def test_the_load_of_the_model_is_summed_over_its_engines_and_no_other_model_counts() -> None:
    assert read_load(SCRAPE, "m") == ServerLoad(waiting=2, running=8)
    assert read_load(SCRAPE, "other") == ServerLoad(waiting=9, running=30)
    assert read_load(SCRAPE, "absent") is None
    assert read_load("# nothing of vLLM's\nup 1\n", "m") is None


def test_a_malformed_scrape_is_an_error_not_a_load() -> None:
    with pytest.raises(ValueError):
        read_load("vllm:num_requests_waiting{model_name=\"m\" 2\n", "m")


@pytest.mark.parametrize(("allowed", "load", "in_use", "prioritised", "expected"), [
    (16, ServerLoad(waiting=1, running=32), 16, False, 8),  # a request waits: halve at once
    (16, ServerLoad(waiting=3, running=32), 16, True, 17),  # prioritised: a short queue (ours) is borne...
    (16, ServerLoad(waiting=5, running=32), 16, True, 8),   # ...up to running / 8
    (1, ServerLoad(waiting=9, running=32), 1, False, 1),    # never under the floor
    (10, ServerLoad(waiting=0, running=20), 10, False, 11),  # room, and the limit holds the route back: +1
    (10, ServerLoad(waiting=0, running=20), 4, False, 10),   # room, but the limit is not used: not probed
    (64, ServerLoad(waiting=0, running=20), 64, False, 64),  # never over the ceiling
])
def test_aimd_halves_while_requests_wait_and_adds_one_while_there_is_room(
        allowed: int, load: ServerLoad, in_use: int, prioritised: bool, expected: int) -> None:
    assert Aimd().step(allowed, load, in_use, ceiling=64, prioritised=prioritised) == expected


def _ask(worker: str, want: int, held: int = 0, now: float = 100.0,
         proposal: tuple[int, int] | None = None) -> ShareAsk:
    return ShareAsk("r", worker, want, held, now, initial=2, proposal=proposal)


def test_workers_share_the_allowed_concurrency_equally_and_never_exceed_it_together() -> None:
    state, first = exchange(None, _ask("a", want=50, proposal=(0, 12)))
    assert (first.allowed, first.version, first.grant) == (12, 1, 12)  # alone: all of it
    state, second = exchange(state, _ask("b", want=50))
    assert second.grant == 0  # a holds all 12 until its next turn
    state, first = exchange(state, _ask("a", want=50, held=12))
    assert first.grant == 6 and first.reserved == 12  # its fair half; its 12 in flight still count
    state, first = exchange(state, _ask("a", want=50, held=6))
    state, second = exchange(state, _ask("b", want=50))
    assert (first.grant, second.grant, second.reserved) == (6, 6, 12)
    state, third = exchange(state, _ask("c", want=2))  # a small want is met first
    assert third.grant == 0  # nothing is free until a and b shrink
    state, first = exchange(state, _ask("a", want=50, held=6))
    assert first.grant == 5  # (12 - 2) / 2
    grants: dict[str, int] = {}
    for worker, want in (("a", 50), ("b", 50), ("c", 2), ("a", 50), ("b", 50), ("c", 2)):
        state, reply = exchange(state, _ask(worker, want=want, held=grants.get(worker, 0)))
        grants[worker] = reply.grant
        assert sum(grants.values()) <= reply.allowed
    assert grants == {"a": 5, "b": 5, "c": 2}


def test_a_step_is_taken_once_per_version_and_a_silent_worker_drops_out() -> None:
    state, reply = exchange(None, _ask("a", want=10, proposal=(0, 8)))
    state, late = exchange(state, _ask("b", want=10, proposal=(0, 4)))  # stepped from a stale version
    assert (late.allowed, late.version) == (8, 1)
    state, reply = exchange(state, _ask("b", want=10, now=200.0))  # a's part expired (ttl 5 s)
    assert reply.grant == 8 and reply.reserved == 8
