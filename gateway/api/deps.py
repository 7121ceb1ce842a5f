"""What every route needs: the runtime, the caller, list replies, argument checks."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from gateway.api.auth import Principal, current_principal
from gateway.api.http_errors import ApiError

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime

Caller = Annotated[Principal, Depends(current_principal)]


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def list_reply(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    # OpenAI's schema types first_id/last_id as strings (and requires them on a file list), so an
    # empty page answers "" rather than null; the SDK's cursor pages read neither (they page by
    # the last item's id and `has_more`).
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else "",
        "last_id": data[-1]["id"] if data else "",
        "has_more": has_more,
    }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
# Azure's dated versions (2024-10-21, 2025-04-01-preview) and its v1 API's names.
_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?|preview|latest|v1")


def check_id(value: str, prefix: str, param: str) -> str:
    """An id of ours begins with its kind (OpenAI answers a malformed one 400, an unknown one 404)."""
    if not value.startswith(prefix) or _ID.fullmatch(value) is None:
        shown = value if len(value) <= 64 else value[:64] + "…"
        raise bad_request(f"Invalid '{param}': '{shown}'. Expected an ID that begins with '{prefix}'.",
                          param=param, code="invalid_id")
    return value


def check_api_version(request: Request) -> None:
    """Router dependency: `?api-version=` (Azure's clients send it) is ignored, but must look like one."""
    version = request.query_params.get("api-version")
    if version is not None and _API_VERSION.fullmatch(version) is None:
        raise bad_request(f"Unsupported api-version '{version[:64]}'.", param="api-version",
                          code="invalid_api_version")


def check_limit(limit: int, high: int) -> int:
    if not 1 <= limit <= high:
        raise bad_request(f"limit must be between 1 and {high}, got {limit}.", param="limit", code="invalid_limit")
    return limit


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], data: Any, *where: str) -> M:
    """`data` as `model`; a failure is FastAPI's validation error (OpenAI's shape, the dotted param, 400)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *where, *e["loc"])} for e in exc.errors(include_url=False, include_context=False)]
        ) from None
