"""Checking one input line at a time.

`LineChecker` turns raw lines into `BatchRequest`s or `LineError`s with
OpenAI's codes and 1-based line numbers. It keeps only the set of custom_ids
seen (bounded by the line limit), never the lines themselves.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gateway.config.schema import Config
from gateway.config.urls import normalise_url
from gateway.errors import LineCode, LineError
from gateway.pipeline.body_fields import check_body
from gateway.records import BatchRequest, Endpoint

# Problems that make the whole file unusable in every mode (vLLM's run_batch
# also exits on them). The others (unknown model, unsupported url, stream) can
# be answered per line, as run_batch does, when the batch is not strict.
FATAL_CODES = frozenset(
    {
        LineCode.INVALID_JSON_LINE,
        LineCode.MISSING_REQUIRED_PARAMETER,
        LineCode.INVALID_REQUEST,
        LineCode.INVALID_TYPE,
        LineCode.DUPLICATE_CUSTOM_ID,
        LineCode.EMPTY_FILE,
        LineCode.TOO_MANY_TASKS,
        LineCode.FILE_TOO_LARGE,
    }
)

_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class LineProblem:
    """A line that parsed well enough to answer in place, but can't be run."""

    error: LineError
    custom_id: str
    model: str


class LineChecker:
    def __init__(
        self, config: Config, *, endpoint: Endpoint | None, allowed_models: Collection[str] | None,
        allow_duplicates: bool = False,
    ) -> None:
        self._config = config
        self._endpoint = endpoint  # the batch's endpoint; None: any (the CLI)
        self._allowed = set(allowed_models) if allowed_models is not None else None
        self._seen: set[str] = set()
        # run_batch answers a repeated custom_id line by line; OpenAI rejects the file. Either way we count them.
        self._allow_duplicates = allow_duplicates
        self.repeats = 0
        self.first_repeat: tuple[str, int] | None = None  # (custom_id, line) of the first repeat, for the warning

    def check(self, raw: bytes, line: int) -> BatchRequest | LineError | LineProblem | None:
        """One physical line (without its newline); None for a blank line."""
        if line == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            return None
        limit = self._config.batch.limits.max_line_bytes
        if len(raw) > limit:
            return LineError(LineCode.INVALID_REQUEST, f"line is {len(raw)} bytes; the limit is {limit}", line)
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            # OpenAI's wording, then where the parser stopped
            return LineError(LineCode.INVALID_JSON_LINE, f"This line is not parseable as valid JSON. ({exc})", line)
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
            return LineError(LineCode.INVALID_REQUEST, f"method must be POST, got {method!r}", line, "method")
        if not isinstance(url, str):
            return LineError(LineCode.INVALID_REQUEST, "url must be a string", line, "url")
        if not isinstance(body, dict):
            return LineError(LineCode.INVALID_REQUEST, "body must be a JSON object", line, "body")
        if custom_id in self._seen:
            if not self._allow_duplicates:
                return LineError(
                    LineCode.DUPLICATE_CUSTOM_ID, f"custom_id {custom_id!r} appears more than once", line, "custom_id"
                )
            self.repeats += 1
            if self.first_repeat is None:
                self.first_repeat = (custom_id, line)
        self._seen.add(custom_id)

        model = body.get("model")
        normal = normalise_url(url)
        if normal is not None and normal.deployment and model is None:
            body = {**body, "model": normal.deployment}
            model = normal.deployment
        model_str = model if isinstance(model, str) else ""

        def problem(code: LineCode, message: str, param: str) -> LineProblem:
            return LineProblem(LineError(code, message, line, param), custom_id, model_str)

        if normal is None:
            return problem(LineCode.INVALID_URL, f"The provided url '{url}' is not supported by the Batch API.", "url")
        if self._endpoint is not None and normal.endpoint is not self._endpoint:
            return problem(
                LineCode.INVALID_URL,
                f"The URL provided for this request does not match the batch endpoint ({self._endpoint.value}).",
                "url",
            )
        if model is None:
            return LineError(
                LineCode.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'body.model'.", line, "body.model"
            )
        if not isinstance(model, str) or not model:
            return LineError(LineCode.INVALID_REQUEST, "body.model must be a non-empty string", line, "body.model")
        wrong = check_body(normal.endpoint, body, line)
        if wrong is not None:
            return wrong
        if body.get("stream") is True:
            return problem(LineCode.STREAMING_UNSUPPORTED, "Streaming is not supported by the Batch API.",
                           "body.stream")
        route = self._config.route(model)
        if route is None or (self._allowed is not None and route.model_name not in self._allowed):
            # OpenAI's "is not supported by the Batch API", with vLLM's "does not exist" (run_batch's wording)
            return problem(LineCode.MODEL_NOT_FOUND,
                           f"The provided model '{model}' does not exist or is not supported by the Batch API.",
                           "body.model")
        return BatchRequest(line=line, custom_id=custom_id, url=normal.endpoint, body=body)
