"""`Idempotency-Key` on `POST /v1/files` and `POST /v1/batches`, in both modes (real processes, the openai SDK):

- a create retried with its key (after the client gave up on the first, or simply sent twice) gets the first
  object back, `Idempotent-Replayed: true`, and the team has one object, not two;
- the same key with another request is a 400 `idempotency_error` naming the key (across kinds too);
- eight threads creating with one key at once make one object, and all get it;
- another team's key of the same text is its own; a create that fails keeps nothing of its key;
- Llama Stack's `idempotency_key` in the batch body (the SDK's `extra_body`) is the same key as the header;
- a key another process still holds: the request waits, then 409; a reservation that lapses is taken over.
The store's part on its own (both stores alike) is in `test_store_parity.py`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import FileObject

from gateway.api.idempotency import HEADER
from gateway.callers.idempotent_creates import WAIT_SECONDS
from gateway.runtime.runtime import DB_NAME
from gateway.store.protocols import IdempotencyKeys
from gateway.store.redis.connection import connect_redis
from gateway.store.redis.store import RedisStore
from gateway.store.sqlite.store import SQLiteStore
from tests.fakes.upstream.server import Upstream
from tests.support.loops import run_apart
from tests.support.server_helpers import Gateway, gateway_config, jsonl
from tests.support.team_helpers import MODEL, MODES, lines, serve

TEAMS = [{"team_id": "team-a", "api_keys": ["sk-a"]}, {"team_id": "team-b", "api_keys": ["sk-b"]}]


class Served(NamedTuple):
    gateway: Gateway
    redis_url: str | None  # shared mode: the Redis its store is in


@pytest.fixture(scope="module", params=MODES)
def served(request: pytest.FixtureRequest, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key="sk-admin")
    redis_url = request.getfixturevalue("redis_server").url if request.param == "shared" else None
    with serve(request.param, config, tmp_path_factory.mktemp(request.param) / "data", redis_url) as gw:
        yield Served(gw, redis_url)


def _key(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex}"


def _upload(client: OpenAI, name: str, key: str | None = None, text: str = "x") -> FileObject:
    headers = {HEADER: key} if key else None
    return client.files.create(file=(name, jsonl(lines(2, text, sleep_ms=0))), purpose="batch",
                               extra_headers=headers)


def _body(file_id: str, **more: Any) -> dict[str, Any]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **more}


def _batches_of(client: OpenAI, file_id: str) -> list[str]:
    return [b.id for b in client.batches.list(limit=100).data if b.input_file_id == file_id]


def _files_named(client: OpenAI, name: str) -> list[str]:
    return [f.id for f in client.files.list().data if f.filename == name]


def _refusal(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    body = caught.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_a_batch_create_retried_after_the_client_gave_up_returns_the_first_batch(served: Served) -> None:
    gw, key = served.gateway, _key("retry")
    client = gw.client("sk-a")
    file = _upload(client, "retry.jsonl")
    # The first try gives up before the answer (a read timeout of half a millisecond): the server goes on.
    # The SDK itself, with no retry of its own, so the dropped try is the only one.
    hasty = client.with_options(timeout=httpx.Timeout(10, read=0.0005), max_retries=0)
    with contextlib.suppress(openai.APITimeoutError):
        hasty.batches.create(**_body(file.id), extra_headers={HEADER: key})
    again = client.batches.with_raw_response.create(**_body(file.id), extra_headers={HEADER: key})
    first = again.parse()
    assert _batches_of(client, file.id) == [first.id]
    third = client.batches.with_raw_response.create(**_body(file.id), extra_headers={HEADER: key})
    assert third.status_code == 200 and third.headers["Idempotent-Replayed"] == "true"
    assert third.parse().id == first.id and third.parse().input_file_id == file.id
    assert _batches_of(client, file.id) == [first.id]


def test_an_upload_sent_twice_with_its_key_stores_one_file(served: Served) -> None:
    client, key = served.gateway.client("sk-a"), _key("upload")
    first = _upload(client, "twice.jsonl", key)
    again = client.files.with_raw_response.create(file=("twice.jsonl", jsonl(lines(2, "x", sleep_ms=0))),
                                                  purpose="batch", extra_headers={HEADER: key})
    assert again.headers["Idempotent-Replayed"] == "true" and again.parse().id == first.id
    assert _files_named(client, "twice.jsonl") == [first.id]
    # Another file (other bytes, another name, another purpose) with that key: refused, nothing stored.
    for name, text, purpose in [("twice.jsonl", "other bytes", "batch"), ("other.jsonl", "x", "batch"),
                                ("twice.jsonl", "x", "user_data")]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.files.create(file=(name, jsonl(lines(2, text, sleep_ms=0))), purpose=purpose,  # type: ignore[arg-type]
                                extra_headers={HEADER: key})
        error = _refusal(caught)
        assert (error["code"], error["param"]) == ("idempotency_error", HEADER) and key in error["message"]
    assert _files_named(client, "twice.jsonl") == [first.id] and _files_named(client, "other.jsonl") == []


def test_the_same_key_with_another_batch_request_is_a_400_naming_the_key(served: Served) -> None:
    client, key = served.gateway.client("sk-a"), _key("differ")
    file = _upload(client, "differ.jsonl")
    first = client.batches.create(**_body(file.id, metadata={"run": "1"}), extra_headers={HEADER: key})
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(**_body(file.id, metadata={"run": "2"}), extra_headers={HEADER: key})
    error = _refusal(caught)
    assert error["code"] == "idempotency_error" and error["param"] == HEADER and key in error["message"]
    assert _batches_of(client, file.id) == [first.id]
    # A file's key reused for a batch is another request too.
    file_key = _key("kinds")
    _upload(client, "kinds.jsonl", file_key)
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(**_body(file.id), extra_headers={HEADER: file_key})
    assert _refusal(caught)["code"] == "idempotency_error"
    # A key that is not one: a 400 naming the header.
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(**_body(file.id), extra_headers={HEADER: "k" * 256})
    assert _refusal(caught)["param"] == HEADER
    assert _batches_of(client, file.id) == [first.id]


def test_concurrent_creates_with_one_key_make_one_object(served: Served) -> None:
    client, threads = served.gateway.client("sk-a"), 8
    file_key, batch_key = _key("race-file"), _key("race-batch")
    start = threading.Barrier(threads)

    def upload(_: int) -> str:
        start.wait()
        return _upload(client, "race.jsonl", file_key).id

    with ThreadPoolExecutor(threads) as pool:
        file_ids = set(pool.map(upload, range(threads)))
    assert len(file_ids) == 1 and _files_named(client, "race.jsonl") == list(file_ids)
    (file_id,) = file_ids

    def create(_: int) -> str:
        start.wait()
        return client.batches.create(**_body(file_id), extra_headers={HEADER: batch_key}).id

    with ThreadPoolExecutor(threads) as pool:
        batch_ids = set(pool.map(create, range(threads)))
    assert len(batch_ids) == 1 and _batches_of(client, file_id) == list(batch_ids)


def test_another_team_with_the_same_key_gets_its_own_objects(served: Served) -> None:
    key, file_key = _key("shared-text"), _key("shared-file")
    a, b = served.gateway.client("sk-a"), served.gateway.client("sk-b")
    file_a, file_b = _upload(a, "team.jsonl", file_key), _upload(b, "team.jsonl", file_key)
    assert file_a.id != file_b.id
    assert _files_named(a, "team.jsonl") == [file_a.id] and _files_named(b, "team.jsonl") == [file_b.id]
    batch_a = a.batches.create(**_body(file_a.id), extra_headers={HEADER: key})
    batch_b = b.batches.create(**_body(file_b.id), extra_headers={HEADER: key})
    assert batch_a.id != batch_b.id and _batches_of(b, file_b.id) == [batch_b.id]
    with pytest.raises(openai.NotFoundError):  # and neither sees the other's
        b.batches.retrieve(batch_a.id)


def test_a_failed_create_keeps_nothing_of_its_key(served: Served) -> None:
    client, key = served.gateway.client("sk-a"), _key("failed")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(**_body("file-doesnotexist"), extra_headers={HEADER: key})
    file = _upload(client, "failed.jsonl")
    batch = client.batches.create(**_body(file.id), extra_headers={HEADER: key})  # another body: no 400
    assert client.batches.create(**_body(file.id), extra_headers={HEADER: key}).id == batch.id


def test_the_body_idempotency_key_of_llama_stack_clients_is_the_same_key(served: Served) -> None:
    client, key = served.gateway.client("sk-a"), _key("body")
    file = _upload(client, "body.jsonl")
    first = client.batches.create(**_body(file.id), extra_body={"idempotency_key": key})
    again = client.batches.with_raw_response.create(**_body(file.id), extra_body={"idempotency_key": key})
    assert again.parse().id == first.id and again.headers["Idempotent-Replayed"] == "true"
    # The header and the body name one key: the same request either way.
    assert client.batches.create(**_body(file.id), extra_headers={HEADER: key}).id == first.id
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(**_body(file.id), extra_headers={HEADER: key + "x"}, extra_body={"idempotency_key": key})
    assert _refusal(caught)["param"] == "idempotency_key"
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(**_body(file.id), extra_body={"idempotency_key": 7})
    assert _refusal(caught)["code"] == "invalid_type"
    assert _batches_of(client, file.id) == [first.id]


@contextlib.asynccontextmanager
async def _keys(served: Served) -> AsyncIterator[IdempotencyKeys]:
    """The gateway's store, opened from here: as another process of the deployment sees it."""
    store = SQLiteStore(served.gateway.data_dir / DB_NAME) if served.redis_url is None else \
        RedisStore(connect_redis(served.redis_url))
    try:
        yield store.idempotency
    finally:
        await store.aclose()


def _hold_elsewhere(served: Served, key: str, hold: float) -> None:
    async def reserve() -> None:
        async with _keys(served) as keys:
            assert await keys.reserve("team-a", key, "another-process", "", hold) is None

    run_apart(reserve())


def test_a_key_held_elsewhere_waits_then_409s_and_a_lapsed_hold_is_taken_over(served: Served) -> None:
    client = served.gateway.client("sk-a")
    file = _upload(client, "busy.jsonl")
    busy = _key("busy")
    _hold_elsewhere(served, busy, 120)
    started = time.monotonic()
    with pytest.raises(openai.ConflictError) as caught:
        client.batches.create(**_body(file.id), extra_headers={HEADER: busy})
    assert time.monotonic() - started >= WAIT_SECONDS - 0.5
    error = _refusal(caught)
    assert error["code"] == "idempotency_key_in_use" and busy in error["message"]
    assert _batches_of(client, file.id) == []
    # A process that died holding a key: its reservation lapses, and the waiting request makes the batch.
    lapsing = _key("lapsing")
    _hold_elsewhere(served, lapsing, 1.5)
    batch = client.batches.create(**_body(file.id), extra_headers={HEADER: lapsing})
    assert _batches_of(client, file.id) == [batch.id]
