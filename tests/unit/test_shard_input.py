"""A shard names its lines where they are in the input file, and the runner reads back exactly the requests the
checker made of them.

- Every url form of every endpoint, a deployment url that gives the model, a BOM, `\\r\\n` line ends, blank
  lines, long integers, non-ASCII text and lines answered in place, in shards of three over routes that
  alternate: each shard's requests, read back from the input (a plain blob, or an Upload's parts cut
  mid-line), are the checker's, in input order.
- A batch's shards share one blob of runs of lines, not their bytes: a file of one model is one run per shard,
  and no shard has a blob of its own.
- A gap of other routes' lines over `GAP_BYTES` is skipped by a ranged read of its own, not read through.
- An input cut short of a shard's lines is an error, never a short shard; a shard merged (the merge's
  checkpoint says so) reads as None, its lines still named; the forms of earlier versions (a blob per shard
  of its runs, or of its requests themselves) are read as they are, and as None once that blob is gone.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.config.endpoints import ENDPOINTS
from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, Endpoint, Shard
from gateway.pipeline import checkpoint
from gateway.pipeline.plan import PlanJob, plan_batch
from gateway.pipeline.shard_input import FORM, FORM_PER_SHARD, GAP_BYTES, InputChanged, first_line, read_requests
from gateway.pipeline.validate import LineChecker
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import batch_prefix, merge_checkpoint_key, shard_lines_key, shard_requests_key
from gateway.store.protocols import Blobs
from tests.support.services import shared_config

MODELS = ("gpt-mini", "gpt-big", "embed-small")
CONFIG = parse_config(shared_config("http://127.0.0.1:9/v1", MODELS, shard_size=3))
PREFIXES = ("/v1/", "/", "", "/openai/", "/openai/v1/")


def _value(endpoint: Endpoint, name: str) -> Any:
    kinds, _ = ENDPOINTS[endpoint].types.get(name, ((str,), ""))
    if list in kinds:
        return [{"role": "user", "content": "héllo ✓"}] if name == "messages" else ["a", "b"]
    if dict in kinds:
        return {"k": "v"}
    return "héllo ✓"


def _body(endpoint: Endpoint, model: str | None) -> dict[str, Any]:
    rule = ENDPOINTS[endpoint]
    body: dict[str, Any] = {name: _value(endpoint, name) for name in (rule.required[0] if rule.required else ())}
    body["seed"] = 123456789012345678901234567890  # past 64 bits: read exactly, never as a float
    if model is not None:
        body["model"] = model
    return body


def _population() -> list[bytes]:
    """Lines of every url form of every endpoint over three routes, with the awkward bytes a file may hold."""
    rng = random.Random(7)
    lines: list[bytes] = []
    n = 0
    for endpoint, rule in ENDPOINTS.items():
        for prefix in (*PREFIXES, "/openai/deployments/{model}/"):
            for model in MODELS:
                n += 1
                deployment = "{model}" in prefix
                url = prefix.replace("{model}", model) + rule.tail + ("?api-version=2024-10-21" if deployment else "")
                line = {"custom_id": f"req-{n}", "method": "POST", "url": url,
                        "body": _body(endpoint, None if deployment else model)}
                lines.append(json.dumps(line, ensure_ascii=rng.random() < 0.5).encode())
                if rng.random() < 0.1:
                    lines.append(b"   ")  # blank: no request, and its line number is skipped
                if rng.random() < 0.1:
                    lines.append(b'{"custom_id": "bad-%d", "method": "POST", "url": "/v1/embeddings", '  # answered
                                 b'"body": {"model": "nope", "input": "x"}}' % n)  # in place: an unknown model
    rng.shuffle(lines)
    lines[0] = b"\xef\xbb\xbf" + lines[0]
    return [line + (b"\r" if i % 7 == 0 else b"") for i, line in enumerate(lines)]


async def _store(blobs: Blobs, data: bytes, parts: int) -> str:
    """The input as one blob, or as an Upload's parts (cut anywhere, mid-line too) composed by the store."""
    if parts == 1:
        async with blobs.writing("files/input") as writer:
            await writer.write(data)
        return "files/input"
    cuts = sorted(random.Random(parts).sample(range(1, len(data)), parts - 1))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    for i, piece in enumerate(pieces):
        async with blobs.writing(f"uploads/u/part{i}") as writer:
            await writer.write(piece)
    return await blobs.compose("files/input", [(f"uploads/u/part{i}", len(p)) for i, p in enumerate(pieces)])


async def check_shards_read_back(blobs: Blobs, parts: int) -> None:
    """Plan the population's file and read every shard back: the checker's requests, in input order."""
    lines = _population()
    data = b"\n".join(lines) + b"\n"
    key = await _store(blobs, data, parts)
    outcome = await plan_batch(CONFIG, blobs, PlanJob("batch_r", key, endpoint=None, strict=False,
                                                      allowed_models=None))
    assert not outcome.failed and outcome.answered is not None
    checker = LineChecker(CONFIG, endpoint=None, allowed_models=None, allow_duplicates=True)
    expected: dict[int, BatchRequest] = {}
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        checked = checker.check(raw, number)
        if isinstance(checked, BatchRequest):
            expected[number] = checked
    assert len(expected) > 100
    got: list[BatchRequest] = []
    for shard in outcome.shards:
        requests = await read_requests(blobs, shard)
        assert requests is not None and len(requests) == shard.size
        assert [r.line for r in requests] == sorted(r.line for r in requests)
        assert {CONFIG.route(r.model).model_name for r in requests} == {shard.route}  # type: ignore[union-attr]
        assert await first_line(blobs, shard) == requests[0].line
        got.extend(requests)
    assert sorted(got, key=lambda r: r.line) == [expected[n] for n in sorted(expected)]
    deployed = [r for r in got if "/deployments/" in data.split(b"\n")[r.line - 1].decode()]
    assert deployed and all(r.body["model"] in MODELS for r in deployed)
    assert all(r.body["seed"] == 123456789012345678901234567890 for r in got)


@pytest.mark.parametrize("parts", [1, 7])
async def test_every_shard_reads_back_the_checkers_requests(tmp_path: Path, parts: int) -> None:
    await check_shards_read_back(LocalBlobs(tmp_path / "blobs"), parts)


def _chat(i: int, model: str, pad: int = 0) -> bytes:
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": model, "messages": [{"role": "user", "content": "x" * pad}]}}).encode()


async def test_a_file_of_one_model_is_one_run_per_shard_in_one_blob(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    data = b"\n".join(_chat(i, "gpt-mini", 500) for i in range(10)) + b"\n"
    async with blobs.writing("files/one") as writer:
        await writer.write(data)
    outcome = await plan_batch(CONFIG, blobs, PlanJob("batch_o", "files/one", endpoint=Endpoint.CHAT, strict=True,
                                                      allowed_models=None))
    assert [s.size for s in outcome.shards] == [3, 3, 3, 1]
    blob = b"".join([c async for c in blobs.read(shard_lines_key("batch_o"))])
    header, *rest = blob.splitlines()
    runs = [line for line in rest if len(line.split()) == 3]
    assert header == FORM + b" files/one" and len(runs) == 4  # a run a shard: lines 1-3, 4-6, 7-9, 10
    assert [int(run.split()[0]) for run in runs] == [1, 4, 7, 10]
    assert len(blob) < 60 + 4 * 30 + 5 * 32  # the form, the runs, an index entry a shard and the trailer
    kept = sorted(p.relative_to(tmp_path / "blobs").as_posix() for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    assert kept == [shard_lines_key("batch_o"), "files/one"]
    assert [await first_line(blobs, shard) for shard in outcome.shards] == [1, 4, 7, 10]


async def test_a_long_gap_is_skipped_and_a_cut_input_is_an_error(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    config = parse_config(shared_config("http://127.0.0.1:9/v1", MODELS, shard_size=1000))
    filler = [_chat(100 + i, "gpt-big", 4000) for i in range(GAP_BYTES // 4000 + 10)]  # over GAP_BYTES of them
    lines = [_chat(1, "gpt-mini"), *filler, _chat(2, "gpt-mini"), _chat(3, "gpt-mini")]
    data = b"\n".join(lines) + b"\n"
    async with blobs.writing("files/gap") as writer:
        await writer.write(data)
    outcome = await plan_batch(config, blobs, PlanJob("batch_g", "files/gap", endpoint=Endpoint.CHAT, strict=True,
                                                      allowed_models=None))
    mini = next(s for s in outcome.shards if s.route == "gpt-mini")
    requests = await read_requests(blobs, mini)
    assert requests is not None and [r.custom_id for r in requests] == ["c1", "c2", "c3"]
    assert [r.line for r in requests] == [1, len(lines) - 1, len(lines)]
    # the input cut before the shard's last lines (replaced behind the store's back): an error, not two lines
    async with blobs.writing("files/gap") as writer:
        await writer.write(data[: len(data) - len(lines[-1]) - 5])
    with pytest.raises(InputChanged, match="before line"):
        await read_requests(blobs, mini)


async def test_a_merged_shard_reads_as_gone_and_its_neighbours_as_they_are(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    async with blobs.writing("files/six") as writer:
        await writer.write(b"\n".join(_chat(i, "gpt-mini") for i in range(6)) + b"\n")
    outcome = await plan_batch(CONFIG, blobs, PlanJob("batch_m", "files/six", endpoint=Endpoint.CHAT, strict=True,
                                                      allowed_models=None))
    first, second = outcome.shards
    await checkpoint.save(blobs, merge_checkpoint_key("batch_m"), checkpoint.MergeCheckpoint(merged={0}))
    assert await read_requests(blobs, first) is None
    assert [r.custom_id for r in await read_requests(blobs, second) or []] == ["c3", "c4", "c5"]
    assert await first_line(blobs, first) == 1  # still where the merge may stop: before it, nothing is open
    await checkpoint.save(blobs, merge_checkpoint_key("batch_m"), checkpoint.MergeCheckpoint(composed=True))
    assert await read_requests(blobs, second) is None
    await blobs.delete_prefix(batch_prefix("batch_m"))  # the batch ended
    assert await read_requests(blobs, second) is None and await first_line(blobs, second) is None
    # a shard the plan did not make: an error, not another shard's lines
    await plan_batch(CONFIG, blobs, PlanJob("batch_n", "files/six", endpoint=Endpoint.CHAT, strict=True,
                                            allowed_models=None))
    with pytest.raises(ValueError, match="not among the 2 shards"):
        await read_requests(blobs, Shard("batch_n", 7, "gpt-mini", 3))


async def test_the_forms_of_earlier_versions_and_a_sealed_shard(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    old = Shard("batch_old", 0, "gpt-mini", 2)
    written = [BatchRequest(4, "c4", Endpoint.CHAT, {"model": "gpt-mini"}),
               BatchRequest(9, "c9", Endpoint.CHAT, {"model": "gpt-mini", "n": 2})]
    async with blobs.writing(shard_requests_key(old)) as writer:
        for request in written:
            await writer.write(json.dumps(request.to_json()).encode() + b"\n")
    assert await read_requests(blobs, old) == written
    assert await first_line(blobs, old) == 4
    # a blob per shard of its runs (the version before the batch's one blob)
    async with blobs.writing("files/two") as writer:
        await writer.write(_chat(0, "gpt-mini") + b"\n" + _chat(1, "gpt-mini") + b"\n")
    own = Shard("batch_old", 2, "gpt-mini", 2)
    async with blobs.writing(shard_requests_key(own)) as writer:
        await writer.write(FORM_PER_SHARD + b" files/two\n" + b"1 0 %d\n" % (2 * len(_chat(0, "gpt-mini")) + 1))
    assert [r.custom_id for r in await read_requests(blobs, own) or []] == ["c0", "c1"]
    assert await first_line(blobs, own) == 1
    gone = Shard("batch_old", 1, "gpt-mini", 2)
    assert await read_requests(blobs, gone) is None and await first_line(blobs, gone) is None
