"""A hung upstream (it accepts the request and never answers) holds a line no longer than the route's timeout.

The loopback upstream's `#hang` directive holds a request open without a byte of reply; `#hangx1` holds only
the first call with that text. Both upstream paths are covered in one batch: `gpt-mini` takes the OpenAI-wire
pass-through, `mistral-small` LiteLLM's completion path (LiteLLM translates for Mistral). The timeout comes
from `router_settings.timeout`, or from a deployment's `litellm_params.timeout` where the Router's is an
hour: if either were ignored, a hung line would hold its shard far past the wait below.

Native batch jobs too: a job whose first polls hang (`#batch:hangx2`) is polled again after each poll's
timeout, and its lines come back.

A user sees: the batch completes; each hung line is in the error file with code `upstream_timeout`, once,
after the route's retries (`num_retries: 1` here); a line that hung once succeeded on its retry; every
other line succeeded; the API answered another team's `GET /v1/batches` all along; no traceback in the logs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import chat_line, gateway_config, read_jsonl, start_gateway, submit
from tests.support.team_helpers import finished, until

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
ROUTES = ("gpt-mini", "mistral-small")  # the pass-through, and LiteLLM's completion path
TIMEOUT = 1.5  # seconds: the route's


def config(upstream: Upstream, where: str) -> dict[str, Any]:
    """Both routes on the loopback upstream, one retry; the timeout set in `where` ("router" or "deployment")."""
    cfg = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS)
    cfg["model_list"].append({"model_name": "mistral-small", "litellm_params": {
        "model": "mistral/mistral-small", "api_base": upstream.v1_url, "api_key": upstream.api_key}})
    if where == "router":
        cfg["router_settings"] = {"num_retries": 1, "timeout": TIMEOUT}
    else:
        cfg["router_settings"] = {"num_retries": 1, "timeout": 3600}
        for entry in cfg["model_list"]:
            entry["litellm_params"]["timeout"] = TIMEOUT
    return cfg


@pytest.mark.parametrize("where", ["router", "deployment"])
def test_a_hung_upstream_fails_its_lines_with_upstream_timeout_and_the_rest_run(
    upstream: Upstream, tmp_path: Path, where: str
) -> None:
    lines = []
    for model in ROUTES:
        lines += [chat_line(f"{model}-hang-{i}", model, f"#hang #count {model} {where} {i}") for i in range(2)]
        lines += [chat_line(f"{model}-once-{i}", model, f"#hangx1 #count {model} {where} {i}") for i in range(2)]
        lines += [chat_line(f"{model}-ok-{i}", model, f"fine {where} {i}") for i in range(8)]
    with start_gateway(config(upstream, where), tmp_path / "data", workers=1) as gw:
        alpha, beta = gw.client("sk-alpha"), gw.client("sk-beta")
        batch_id = submit(alpha, lines).id

        def done_while_the_api_answers(b: Any) -> bool:
            assert beta.batches.list(limit=5).data == []  # another team's GET answers while lines hang
            return finished(b)

        batch = until(gw, "sk-alpha", batch_id, done_while_the_api_answers, timeout=90)
        assert batch.status == "completed", gw.log()[-3000:]
        errors = {r["custom_id"]: r["error"] for r in read_jsonl(alpha, batch.error_file_id)}
        outputs = {r["custom_id"]: r["response"] for r in read_jsonl(alpha, batch.output_file_id)}
        hung = {f"{m}-hang-{i}" for m in ROUTES for i in range(2)}
        assert set(errors) == hung, errors
        for custom_id, error in errors.items():
            assert error["code"] == "upstream_timeout", (custom_id, error)
        assert set(outputs) == {line["custom_id"] for line in lines} - hung
        assert all(r["status_code"] == 200 for r in outputs.values()), outputs
        logs = gw.log() + "".join(p.read_text() for p in (tmp_path / "data" / "logs").glob("*.log"))
        assert "Traceback" not in logs, logs[-4000:]
    # each hung line was tried twice (once and the route's one retry), and so was each line that hung once
    calls = {text: n for text, n in upstream.stats()["by_custom"].items() if f" {where} " in text}
    assert sorted(calls.values()) == [2] * 8, calls


async def test_a_hung_poll_of_a_native_job_is_held_no_longer_than_the_timeout(
    upstream: Upstream, tmp_path: Path
) -> None:
    """A native batch job whose first polls are never answered (`#batch:hangx2`): each poll gives up at the
    deployment's timeout, the job is polled again, and its lines come back; nothing fails."""
    from gateway.config.schema import parse_config
    from gateway.domain import BatchRequest, BatchStatus, Endpoint, Shard, new_id
    from gateway.store.records import BatchRecord, now
    from gateway.store.sqlite.store import SQLiteStore
    from providers.native.runner import NativeBatchBackend

    entry = {"model_name": "native", "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2},
             "litellm_params": {"model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": "sk-x",
                                "timeout": TIMEOUT}}
    route = parse_config({"model_list": [entry]}).routes["native"]
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        batch_id, t = new_id("batch"), now()
        await store.batches.put(BatchRecord(id=batch_id, owner="", endpoint="*", input_file_id="file-x",
                                            completion_window="24h", status=BatchStatus.IN_PROGRESS, created_at=t,
                                            expires_at=t + 3600))
        shard = Shard(batch_id=batch_id, index=0, route="native", size=3)
        await store.ledger.put_shards(batch_id, [shard])
        texts = ["#batch:hangx2 hi 0", "hi 1", "hi 2"]  # the directive rides in the job's input file
        requests = [BatchRequest(line=i, custom_id=f"n-{i}", url=Endpoint.CHAT,
                                 body={"model": "native", "messages": [{"role": "user", "content": text}]})
                    for i, text in enumerate(texts)]
        backend = NativeBatchBackend(route, {}, store)
        await backend.start()

        async def run() -> list[Any]:
            return [r async for r in backend.execute_shard(shard, requests)]

        # a deadline for the test, not a timing assert: were the timeout ignored, a poll would hang for an hour
        results = await asyncio.wait_for(run(), 120)
        assert sorted(r.custom_id for r in results) == ["n-0", "n-1", "n-2"]
        assert all(r.status_code == 200 for r in results), [r.body for r in results]
    finally:
        await store.aclose()
