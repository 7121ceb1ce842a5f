"""A stand-in for Groq's Files and Batch APIs on loopback (`python -m tests.fakes.stubs_groq`).

Groq serves OpenAI's format under `/openai/v1` (its reference and its SDK: `POST /openai/v1/files`, multipart
`file` and `purpose=batch`; `POST /openai/v1/batches` with `input_file_id`, `endpoint`, `completion_window`,
`metadata`; `GET /openai/v1/batches/{id}`, `POST /openai/v1/batches/{id}/cancel`, `GET /openai/v1/files/{id}/content`).
It is the loopback upstream (`tests.fakes.upstream`) held to Groq's differences, refused in OpenAI's error shape:
- nothing is served under `/v1` or `/openai` (only `/openai/v1`);
- a batch takes `/v1/chat/completions` only, in that `/v1/` form;
- `completion_window` from `24h` to `7d` (hours or days), where OpenAI takes only `24h`;
- the batch list (`GET /openai/v1/batches`) documents no query parameter: it answers every batch of the key,
  newest first, in one list, and refuses a paging parameter (`after`, `limit`) with 400 so that a client that
  pages as OpenAI does is seen;
- an input file holds at most 50,000 lines and 100 MB (`--max-requests` lowers the lines for tests).
Real-time chat is served at `/openai/v1/chat/completions` (the same replies and `#` directives as the upstream).
"""

from __future__ import annotations

import re

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from tests.fakes.stub_process import serve, stub_arguments
from tests.fakes.upstream.app import RealtimeFastPath, UpstreamServer
from tests.fakes.upstream.replies import ApiError, _invalid
from tests.fakes.upstream.state import Options, _json

MAX_REQUESTS = 50_000
MAX_BYTES = 100_000_000
_WINDOW = re.compile(r"([1-9][0-9]*)([hd])")


class GroqServer(UpstreamServer):
    prefixes = ("/openai/v1",)
    batch_endpoints = {"/chat/completions": "chat"}

    def __init__(self, options: Options, max_requests: int) -> None:
        super().__init__(options)
        self.max_requests = max_requests

    def check_window(self, value: object) -> None:
        match = _WINDOW.fullmatch(value) if isinstance(value, str) else None
        hours = int(match.group(1)) * (24 if match.group(2) == "d" else 1) if match else 0
        if not 24 <= hours <= 168:
            raise _invalid("completion_window", f"Invalid value for 'completion_window': {value!r}. It must be "
                           "between 24h and 7d.")

    async def create_batch(self, request: Request) -> Response:
        body = await request.json()
        endpoint = body.get("endpoint") if isinstance(body, dict) else None
        if endpoint != "/v1/chat/completions":
            raise _invalid("endpoint", f"Invalid value for 'endpoint': {endpoint!r}. Supported values are: "
                           "'/v1/chat/completions'.")
        stored = self.files.get(str(body.get("input_file_id")))
        if stored is not None and (len(stored.content.splitlines()) > self.max_requests
                                   or len(stored.content) > MAX_BYTES):
            raise ApiError(400, f"The input file holds more than {self.max_requests} requests or "
                           f"{MAX_BYTES} bytes.", param="input_file_id", code="file_too_large")
        return await super().create_batch(request)

    async def list_batches(self, request: Request) -> Response:
        for name in request.query_params:
            raise _invalid(name, f"Unknown query parameter '{name}'.")
        return _json({"object": "list", "data": [job.obj for job in reversed(self.batches.values())]})


class _OnlyUnderGroqBase(RealtimeFastPath):
    """Real-time requests at `/openai/v1/chat/completions` only (the upstream also serves `/v1`)."""

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] != "/openai/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def build_app(server: GroqServer) -> Starlette:
    app = Starlette(routes=server.routes(), middleware=[Middleware(_OnlyUnderGroqBase, server=server)])
    app.state.upstream = server
    return app


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_groq", "Groq Files and Batch API stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="requests per batch at most")
    args = parser.parse_args()
    server = GroqServer(Options(batch_delay=args.batch_delay, api_key=args.api_key), args.max_requests)
    serve(build_app(server), args)


if __name__ == "__main__":
    main()
