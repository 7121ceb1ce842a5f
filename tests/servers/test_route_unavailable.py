"""A local model that cannot start stops only its own route.

A config whose local route names a model path that does not exist, beside an upstream route, and one file
that uses both: the worker keeps serving the upstream lines, the local lines fail once with
`model_unavailable` and the engine's reason (no attempt spent, no worker restarted), and the batch
finishes. The API's `/health`, its log and the dashboard say which route and why. Before, the worker exited
at start, was started again every 10 s, and not one line ran.
"""

from __future__ import annotations

from pathlib import Path

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import chat_line, gateway_config, read_jsonl, start_gateway, submit, wait_batch
from tests.support.waiting import eventually


def test_a_local_route_that_cannot_start_fails_its_lines_and_nothing_else(upstream: Upstream, tmp_path: Path) -> None:
    config = gateway_config(upstream, models=("gpt-mini",))
    missing = tmp_path / "no-such-model"
    config["model_list"].append({"model_name": "tiny", "litellm_params": {"model": f"vllm/{missing}"}})
    with start_gateway(config, tmp_path / "data", workers=1) as gw:
        worker = eventually(lambda: gw.http("GET", "/health").json()["workers"], 60, "the worker")[0]["pid"]
        client = gw.client(None)
        lines = [chat_line(f"{model}-{i}", model, f"hi {i}") for i in range(6) for model in ("gpt-mini", "tiny")]
        batch = wait_batch(client, submit(client, lines).id, timeout=90)
        assert batch.status == "completed", gw.log()[-3000:]
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (6, 6)
        errors = {r["custom_id"]: r["error"] for r in read_jsonl(client, batch.error_file_id)}
        assert set(errors) == {f"tiny-{i}" for i in range(6)}
        for error in errors.values():
            assert error["code"] == "model_unavailable"
            assert "'tiny' is unavailable" in error["message"] and "does not exist" in error["message"], error
        assert {r["custom_id"] for r in read_jsonl(client, batch.output_file_id)} == {f"gpt-mini-{i}" for i in range(6)}
        # the same worker did it all: it never exited
        health = gw.http("GET", "/health").json()
        assert [w["pid"] for w in health["workers"]] == [worker]
        assert "exited with" not in gw.log()
        # The API says which route and why: /health, its own log, and the batch's card on the dashboard.
        assert list(health["unavailable_routes"]) == ["tiny"]
        assert "does not exist" in health["unavailable_routes"]["tiny"]
        eventually(lambda: "route 'tiny' is unavailable on worker" in gw.log(), 30, "the API's log line")
        card = gw.http("GET", "/ui").text
        assert 'class="badge unavailable"' in card and "does not exist" in card
