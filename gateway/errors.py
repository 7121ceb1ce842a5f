"""Errors with OpenAI's codes.

- `LineError`: a problem with one input line (1-based `line`).
- `GatewayError` and its kinds: requests the core refuses (the server maps
  them to HTTP statuses; the CLI prints them).
- `ConfigError`: a bad config file.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gateway.env_values import redacted


class LineCode(str, enum.Enum):
    """Validation codes of OpenAI's (and Azure's) batch API."""

    INVALID_JSON_LINE = "invalid_json_line"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    INVALID_REQUEST = "invalid_request"
    INVALID_TYPE = "invalid_type"
    INVALID_URL = "invalid_url"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    MODEL_NOT_FOUND = "model_not_found"
    STREAMING_UNSUPPORTED = "streaming_unsupported"
    EMPTY_FILE = "empty_file"
    TOO_MANY_TASKS = "too_many_tasks"
    FILE_TOO_LARGE = "file_too_large"


# What a per-line error looks like when the request is answered in place (the
# CLI's lenient mode, like vLLM's run_batch): HTTP status and error type.
LINE_HTTP_STATUS: dict[LineCode, tuple[int, str]] = {
    LineCode.MODEL_NOT_FOUND: (404, "NotFoundError"),
    LineCode.INVALID_URL: (400, "BadRequestError"),
    LineCode.STREAMING_UNSUPPORTED: (400, "BadRequestError"),
    LineCode.INVALID_REQUEST: (400, "BadRequestError"),
    # a body without a field its endpoint requires, or of the wrong JSON type (answered per line where the
    # batch is not strict: vLLM's run_batch answers such a line with its server's 400)
    LineCode.MISSING_REQUIRED_PARAMETER: (400, "BadRequestError"),
    LineCode.INVALID_TYPE: (400, "BadRequestError"),
}


@dataclass(frozen=True, slots=True)
class LineError:
    code: LineCode
    message: str
    line: int | None = None
    param: str | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, "param": self.param, "line": self.line}

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.code.value}: {self.message}"


class ConfigError(Exception):
    """A config file that can't be used; the message names the file and the key."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        # a value the config took from the environment is never shown, whatever the key (gateway.env_values)
        self.path, self.key, self.problem = path, key, redacted(problem)
        super().__init__(f"{path}: {key}: {self.problem}")


class GatewayError(Exception):
    """A request the core refuses, in OpenAI's terms (message, code, param).

    The core raises these; `gateway.api.http_errors` maps each kind to its HTTP
    status and the CLI prints the message. No HTTP status lives here.
    """

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


class InvalidRequest(GatewayError):
    """A parameter or value the API does not accept."""


class NotFound(GatewayError):
    """An id that does not exist, or belongs to another team (the same answer for both)."""


class Conflict(GatewayError):
    """An action the object's state does not allow (cancelling a finished batch)."""


class TooLarge(GatewayError):
    """An input over a configured size limit."""


class OverQuota(GatewayError):
    """A team's quota would be exceeded (the code names the quota): try again once batches finish."""


def invalid_value(value: object, supported: list[str], param: str) -> InvalidRequest:
    """OpenAI's refusal of a value outside an enum: "Invalid value: 'x'. Supported values are: 'a', and 'b'."."""
    quoted = [f"'{v}'" for v in supported]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    return InvalidRequest(f"Invalid value: '{shown(value)}'. Supported values are: {listed}.", param=param,
                          code="invalid_value")


SHOWN_CHARS = 64  # of a value a caller sent, quoted in an error message: the message stays small however big it is


def shown(value: object) -> str:
    """`value` as text, cut to its first `SHOWN_CHARS` characters (then "…")."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


# OpenAI's own wording for an unknown id (its code is null; ours names the kind of refusal).
_NOT_FOUND = {"file": "No such File object: {id}", "batch": "No batch found with id '{id}'."}


def not_found(kind: str, id_: str, param: str | None = None) -> NotFound:
    message = _NOT_FOUND.get(kind, "No such {kind} object: {id}").format(kind=kind, id=id_)
    return NotFound(message, code="not_found", param=param)
