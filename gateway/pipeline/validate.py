"""Checking one input line at a time.

`LineChecker` turns raw lines into `BatchRequest`s or `LineError`s with
OpenAI's codes and 1-based line numbers. It keeps only the custom_ids seen
(`SeenIds`: on disk past a threshold, so memory stays flat), never the lines.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config.routes import Route
from gateway.config.schema import Config
from gateway.config.urls import NormalisedUrl, normalise_url
from gateway.config.wildcards import is_pattern, team_allows
from gateway.domain import BatchRequest, Endpoint
from gateway.errors import LineCode, LineError, shown
from gateway.json_codec import loads_checked
from gateway.lines.body_fields import MAX_LINE_DEPTH, check_body
from gateway.lines.output_check import refusal
from gateway.pipeline.seen_ids import SeenIds
from gateway.store.splitter import Overlong, split_lines

_BOM = b"\xef\xbb\xbf"
# Bytes a line may carry beyond `max_line_bytes` while it is read (a BOM, a `\r`): the check is exact after.
LINE_SLACK = len(_BOM) + 1


@dataclass(slots=True)
class LineProblem:
    """A line that parsed well enough to answer in place, but can't be run: an unknown model, an unsupported
    url, a stream, a body field missing or mistyped. It fails a strict batch (the API's) and is answered per
    line elsewhere, as run_batch does. Problems that make the whole file unusable in every mode (vLLM's
    run_batch also exits on them) are a `LineError`."""

    error: LineError
    custom_id: str
    model: str


def line_failure(checked: BatchRequest | LineError | LineProblem, strict: bool) -> LineError | None:
    """The error a checked line gives its file: its own, or a problem's in a strict batch (the API's); None
    for a good line, and for a problem answered in place elsewhere."""
    if isinstance(checked, LineError):
        return checked
    if isinstance(checked, LineProblem) and strict:
        return checked.error
    return None


class LineChecker:
    def __init__(
        self, config: Config, *, endpoint: Endpoint | None, allowed_models: Collection[str] | None,
        allow_duplicates: bool = False, seen: SeenIds | None = None,
    ) -> None:
        """`seen`: where the custom_ids seen are kept (default: a `SeenIds` with its defaults). `close` frees
        its disk once the file is checked."""
        self._config = config
        self._endpoint = endpoint  # the batch's endpoint; None: any (the CLI)
        self._allowed = set(allowed_models) if allowed_models is not None else None
        self._allows: dict[str, bool] = {}  # model -> may the team use it (patterns matched once per model)
        self._seen = seen if seen is not None else SeenIds()
        # run_batch answers a repeated custom_id line by line; OpenAI rejects the file. Either way we count them.
        self._allow_duplicates = allow_duplicates
        self.repeats = 0
        self.first_repeat: tuple[str, int] | None = None  # (custom_id, line) of the first repeat, for the warning

    def close(self) -> None:
        """Free the custom_ids' disk (collection frees it too); the checker forgets the ids it has seen."""
        self._seen.close()

    def _may_use(self, model: str, route: Route) -> bool:
        allowed = self._allows.get(model)
        if allowed is None:
            assert self._allowed is not None
            allowed = self._allows[model] = team_allows(self._allowed, model, route)
        return allowed

    def check(self, raw: bytes | Overlong, line: int) -> BatchRequest | LineError | LineProblem | None:
        """One physical line (without its newline; an `Overlong` when it was too long to keep); None for a
        blank line."""
        limit = self._config.batch.limits.max_line_bytes
        if isinstance(raw, Overlong):
            return LineError(LineCode.INVALID_REQUEST, f"line is {raw.size} bytes; the limit is {limit}", line)
        raw = _bare(raw, line)
        if not raw.strip():
            return None
        if len(raw) > limit:
            return LineError(LineCode.INVALID_REQUEST, f"line is {len(raw)} bytes; the limit is {limit}", line)
        try:
            data = loads_checked(raw, MAX_LINE_DEPTH)
        except Exception as exc:  # whatever the decoder raises is this line's error, never the batch's end
            # OpenAI's wording, then where the parser stopped
            return LineError(LineCode.INVALID_JSON_LINE,
                             f"This line is not parseable as valid JSON. ({shown(exc)})", line)
        if not isinstance(data, dict):
            return LineError(LineCode.INVALID_JSON_LINE, "This line is not parseable as valid JSON (a JSON object).",
                             line)
        return self._check_fields(data, line)

    def _check_fields(self, data: dict[str, Any], line: int) -> BatchRequest | LineError | LineProblem:
        for name in ("custom_id", "method", "url", "body"):
            if data.get(name) is None:
                return LineError(
                    LineCode.MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{name}'.", line, param=name
                )
        custom_id, method, url, body = data["custom_id"], data["method"], data["url"], data["body"]
        if not isinstance(custom_id, str) or not custom_id:
            return LineError(LineCode.INVALID_REQUEST, "custom_id must be a non-empty string", line, "custom_id")
        if not isinstance(method, str) or method.upper() != "POST":
            return LineError(LineCode.INVALID_REQUEST, f"method must be POST, got {shown(repr(method))}", line,
                             "method")
        if not isinstance(url, str):
            return LineError(LineCode.INVALID_REQUEST, "url must be a string", line, "url")
        if not isinstance(body, dict):
            return LineError(LineCode.INVALID_REQUEST, "body must be a JSON object", line, "body")
        if self._seen.add(custom_id):  # seen on an earlier line
            if not self._allow_duplicates:
                return LineError(LineCode.DUPLICATE_CUSTOM_ID,
                                 f"custom_id {shown(custom_id)!r} appears more than once", line, "custom_id")
            self.repeats += 1
            if self.first_repeat is None:
                self.first_repeat = (custom_id, line)

        normal = normalise_url(url)
        if normal is not None:
            body = _deployed(body, normal)
        model = body.get("model")
        model_str = model if isinstance(model, str) else ""

        def problem(code: LineCode, message: str, param: str) -> LineProblem:
            return LineProblem(LineError(code, message, line, param), custom_id, model_str)

        if normal is None:
            return problem(LineCode.INVALID_URL, f"The provided url '{shown(url)}' is not supported by the Batch API.",
                           "url")
        if self._endpoint is not None and normal.endpoint is not self._endpoint:
            return problem(
                LineCode.INVALID_URL,
                f"The URL provided for this request does not match the batch endpoint ({self._endpoint.value}).",
                "url",
            )
        if model is None or not isinstance(model, str) or not model:
            missing = model is None
            error = LineError(LineCode.MISSING_REQUIRED_PARAMETER if missing else LineCode.INVALID_REQUEST,
                              "Missing required parameter: 'body.model'." if missing
                              else "body.model must be a non-empty string", line, "body.model")
            # A Message Batch's params are checked per request (Anthropic answers each one): never the batch's end.
            return problem(error.code, error.message, "body.model") if normal.endpoint is Endpoint.MESSAGES else error
        wrong = check_body(normal.endpoint, body, line)
        if wrong is not None:
            # fails a strict batch (the API's); answered in place elsewhere, as run_batch answers it
            return LineProblem(wrong, custom_id, model)
        refused = refusal(normal.endpoint, body)  # a schema too large to check, or one that cannot compile
        if refused is not None:
            return problem(LineCode.INVALID_REQUEST, refused[1], refused[0])
        if body.get("stream") is True:
            return problem(LineCode.STREAMING_UNSUPPORTED, "Streaming is not supported by the Batch API.",
                           "body.stream")
        route = self._config.route(model)
        if route is not None and route.group is not None and is_pattern(model):
            return problem(LineCode.MODEL_NOT_FOUND, f"The provided model '{shown(model)}' does not exist or is not "
                           "supported by the Batch API (it is a wildcard pattern; name a model it serves).",
                           "body.model")
        if route is None or (self._allowed is not None and not self._may_use(model, route)):
            # OpenAI's "is not supported by the Batch API", with vLLM's "does not exist" (run_batch's wording);
            # a name a wildcard route refused says why (gateway.config.wildcards: a name, never a path)
            why = self._config.resolver.refusal(model) if route is None else None
            return problem(LineCode.MODEL_NOT_FOUND,
                           f"The provided model '{shown(model)}' does not exist or is not supported by the Batch API"
                           + (f" ({why})." if why else "."), "body.model")
        return BatchRequest(line=line, custom_id=custom_id, url=normal.endpoint, body=body)


def _bare(raw: bytes, line: int) -> bytes:
    """A line as it is read: without the file's BOM (on line 1) and a `\r` before its newline."""
    return (raw.removeprefix(_BOM) if line == 1 else raw).rstrip(b"\r")


def _deployed(body: dict[str, Any], normal: NormalisedUrl) -> dict[str, Any]:
    """`body`, with the model an Azure deployment url names when the body names none."""
    return {**body, "model": normal.deployment} if normal.deployment and body.get("model") is None else body


def request_of(raw: bytes, line: int) -> BatchRequest:
    """The request of a line `LineChecker.check` passed, rebuilt from its bytes as the check built it (the
    same `_bare` and `_deployed`): the shard runner reads its lines from the input file
    (`gateway.pipeline.shard_input`), not from a copy. Only for such a line: nothing is checked again."""
    data = loads_checked(_bare(raw, line), None)  # the same value the check read (long integers exact)
    normal = normalise_url(data["url"])
    assert normal is not None, "only a line the checker passed"
    return BatchRequest(line=line, custom_id=data["custom_id"], url=normal.endpoint,
                        body=_deployed(data["body"], normal))


def line_route(config: Config, raw: bytes | Overlong) -> str | None:
    """The route (its model_name) a line names, found as `LineChecker` finds it: `body.model`, else the
    deployment of an Azure deployment url, through `config.route`. None for a line that does not parse or
    names no route (validation refuses it later). What a team's per-model quota counts at create."""
    if isinstance(raw, Overlong):
        return None
    try:
        data = orjson.loads(raw.removeprefix(_BOM))
    except ValueError:
        return None
    body = data.get("body") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        return None
    model, url = body.get("model"), data.get("url")
    if model is None and isinstance(url, str):
        normal = normalise_url(url)
        model = normal.deployment if normal is not None else None
    route = config.route(model) if isinstance(model, str) else None
    return route.model_name if route is not None else None


def count_routes(config: Config, lines: Iterable[bytes | Overlong]) -> Counter[str]:
    """Lines per route (`line_route`); lines that name none are left out. CPU work: callers on an event loop
    run it in a thread."""
    counts: Counter[str] = Counter()
    for raw in lines:
        route = line_route(config, raw)
        if route is not None:
            counts[route] += 1
    return counts


_CHUNK_LINES, _CHUNK_BYTES = 2_000, 1 << 20  # lines checked (or counted) per thread hop (whichever comes first)


async def chunks(lines: AsyncIterable[bytes | Overlong]) -> AsyncIterator[list[bytes | Overlong]]:
    """The lines in lists of `_CHUNK_LINES` or `_CHUNK_BYTES` (whichever comes first): one thread hop each."""
    chunk: list[bytes | Overlong] = []
    size = 0
    async for raw in lines:
        chunk.append(raw)
        size += len(raw) if isinstance(raw, bytes) else 0
        if len(chunk) >= _CHUNK_LINES or size >= _CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


async def count_lines(config: Config, data: AsyncIterable[bytes], per_model: bool) -> tuple[int, dict[str, int]]:
    """A file's lines (a blank line counts too), and with `per_model` its lines per route, streamed (a
    create's quotas count them). Without `per_model` the lines are counted in C and none is parsed. With it
    each is parsed, in a thread (off the API's loop), for the route it names as validation resolves it
    (`line_route`: a deployment url counts for its deployment's model); a line that does not parse, names no
    route or is over `max_line_bytes` (cut off as it is read) counts for none: validation refuses it later."""
    if not per_model:
        count, last = 0, b"\n"
        async for chunk in data:
            count += chunk.count(b"\n")
            last = chunk[-1:] or last
        return count + (last != b"\n"), {}
    lines = 0
    by_model: Counter[str] = Counter()
    async for batch in chunks(split_lines(data, config.batch.limits.max_line_bytes + LINE_SLACK)):
        lines += len(batch)
        by_model.update(await asyncio.to_thread(count_routes, config, batch))
    return lines, dict(by_model)
