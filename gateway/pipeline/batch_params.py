"""The parameters of OpenAI's `POST /v1/batches` (and the files' `expires_after`), typed once.

The HTTP routes validate a body with these models (a failure is FastAPI's validation error, which
`gateway.api.http_errors` answers in OpenAI's shape, naming the dotted param); the service and the
pipeline use the same models for what the CLI passes and what a record stores (`checked`). The
per-line checks of a batch file are not here: `gateway.pipeline.validate` is the hot path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from gateway.errors import InvalidRequest, shown

EXPIRES_AFTER_MIN, EXPIRES_AFTER_MAX = 3600, 2_592_000  # OpenAI's bounds on expires_after[seconds]
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512  # OpenAI's bounds on metadata


def _seconds(value: Any) -> int:
    # A form field is text ("7200"); JSON gives a number. `true` is no number of seconds.
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not EXPIRES_AFTER_MIN <= value <= EXPIRES_AFTER_MAX:
        raise PydanticCustomError(
            "invalid_seconds", "must be an integer between {low} (1 hour) and {high} (30 days)",
            {"low": EXPIRES_AFTER_MIN, "high": EXPIRES_AFTER_MAX},
        )
    return value


class ExpiresAfter(BaseModel):
    """OpenAI's `expires_after` / `output_expires_after`: {anchor: "created_at", seconds: 3600..2592000}."""

    model_config = ConfigDict(frozen=True)
    anchor: Literal["created_at"]
    seconds: Annotated[int, BeforeValidator(_seconds)]

    def at(self, created_at: int) -> int:
        return created_at + self.seconds


Metadata = Annotated[
    dict[Annotated[StrictStr, Field(max_length=METADATA_KEY)], Annotated[StrictStr, Field(max_length=METADATA_VALUE)]],
    Field(max_length=METADATA_PAIRS),
]
_METADATA: TypeAdapter[dict[str, str]] = TypeAdapter(Metadata)

def _present(value: Any) -> Any:
    # OpenAI answers null and "" for a required parameter as it answers its absence
    if value is None or value == "":
        raise PydanticCustomError("missing", "Field required")
    return value


Required = Annotated[StrictStr, BeforeValidator(_present)]


class CreateBatch(BaseModel):
    """The body of `POST /v1/batches`. Keys OpenAI's API has and we do not use are ignored: a
    client sending OpenAI's full body must not be refused for a field that changes nothing here."""

    input_file_id: Required
    endpoint: Required
    completion_window: Required
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


M = TypeVar("M", bound=BaseModel)


def _refusal(exc: ValidationError, param: str, code: str | None = None) -> InvalidRequest:
    error = exc.errors(include_url=False)[0]
    where = ".".join([param, *(shown(p) for p in error["loc"])])  # a metadata key is the caller's: cut
    return InvalidRequest(f"{where}: {error['msg']}", param=where, code=code)


def checked(model: type[M], value: M | Any, param: str) -> M:
    """`value` as `model` (a model already is one); raises `InvalidRequest` naming the dotted param."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise _refusal(exc, param) from None


def checked_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    try:
        return _METADATA.validate_python(value)
    except ValidationError as exc:
        raise _refusal(exc, "metadata", "invalid_metadata") from None


__all__ = [
    "EXPIRES_AFTER_MAX", "EXPIRES_AFTER_MIN", "METADATA_KEY", "METADATA_PAIRS", "METADATA_VALUE", "CreateBatch",
    "ExpiresAfter", "Metadata", "checked", "checked_metadata",
]
