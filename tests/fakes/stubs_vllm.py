"""A loopback stand-in for a vLLM OpenAI server shared with live traffic: `python -m tests.fakes.stubs_vllm`.

- A fixed capacity (`--capacity` requests run at once, vLLM's `max_num_seqs`), each taking `--service-ms`;
  the rest wait in a queue ordered by `(priority, arrival)` under `--scheduling-policy priority`, by arrival
  otherwise (vLLM's `fcfs`). As vLLM's scheduler, a running request is never preempted for a waiting one.
- Without `--scheduling-policy priority` a non-zero `priority` is answered 400 in vLLM's words and error shape
  (`--accept-priority` instead takes and ignores it, as vLLM 0.32 does under `fcfs`).
- `GET /metrics`: vLLM's `vllm:num_requests_running` and `vllm:num_requests_waiting` gauges, labelled
  `model_name` and `engine` as vLLM labels them; `POST /_metrics?up=0` makes it answer 503 (an outage),
  `?up=1` mends it.
- `GET /_stats`: requests served and refused, by priority; the waiting queue's and the running count's time
  averages since the last `POST /_reset`, the most that waited, and the p99 of the time live (priority 0)
  requests waited for a slot, the server's own share of their latency.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import serve, stub_arguments


class Server:
    def __init__(self, capacity: int, service: float, model: str, priority_policy: bool, accept_priority: bool) -> None:
        self.capacity, self.service, self.model = capacity, service, model
        self.priority_policy, self.accept_priority = priority_policy, accept_priority
        self.metrics_up = True
        self._order = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.running = 0
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        self.served: dict[int, int] = {}
        self.refused = 0
        self.metrics_reads = 0
        self.live_waits: list[float] = []  # seconds each priority-0 request waited for a slot
        self.max_waiting = 0
        self._since = self._mark = time.monotonic()
        self._waiting_area = self._running_area = 0.0

    def _account(self) -> None:
        now = time.monotonic()
        self._waiting_area += len(self._queue) * (now - self._mark)
        self._running_area += self.running * (now - self._mark)
        self._mark = now

    async def run(self, priority: int) -> None:
        """Wait for a slot by (priority, arrival), hold it for the service time."""
        self._account()
        arrived = time.monotonic()
        if self.running >= self.capacity or self._queue:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._queue, (priority if self.priority_policy else 0, next(self._order), ready))
            self.max_waiting = max(self.max_waiting, len(self._queue))
            self._admit()
            await ready
        else:
            self.running += 1
        if priority == 0:
            self.live_waits.append(time.monotonic() - arrived)
        try:
            await asyncio.sleep(self.service)
        finally:
            self._account()
            self.running -= 1
            self.served[priority] = self.served.get(priority, 0) + 1
            self._admit()

    def _admit(self) -> None:
        while self.running < self.capacity and self._queue:
            _, _, ready = heapq.heappop(self._queue)
            self.running += 1
            ready.set_result(None)

    def stats(self) -> dict[str, Any]:
        self._account()
        span = max(time.monotonic() - self._since, 1e-9)
        return {"served": {str(k): v for k, v in self.served.items()}, "refused_priority": self.refused,
                "mean_waiting": self._waiting_area / span, "mean_running": self._running_area / span,
                "max_waiting": self.max_waiting, "running": self.running, "waiting": len(self._queue),
                "metrics_reads": self.metrics_reads, "capacity": self.capacity,
                "live_wait_p99_ms": 1000 * _p99(self.live_waits), "live_waited": sum(w > 0 for w in self.live_waits)}

    def metrics(self) -> str:
        self.metrics_reads += 1
        labels = f'engine="0",model_name="{self.model}"'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {float(self.running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {float(len(self._queue))}\n"
        )


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0


def _error(status: int, message: str) -> JSONResponse:
    # vLLM's ErrorResponse
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}},
                        status_code=status)


def build_app(server: Server) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        if body.get("model") != server.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        priority = body.get("priority", 0)
        if not isinstance(priority, int):
            return _error(400, "priority: Input should be a valid integer")
        if priority != 0 and not (server.priority_policy or server.accept_priority):
            server.refused += 1
            return _error(400, f"Got priority {priority} but Priority scheduling is not enabled.")
        await server.run(priority)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if request.url.path.endswith("/chat/completions"):
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "ok"},
                                      "finish_reason": "stop"}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
            kind = "text_completion"
        return JSONResponse({"id": f"cmpl-{next(server._order)}", "object": kind, "created": int(time.time()),
                             "model": server.model, "choices": [choice], "usage": usage})

    async def metrics(request: Request) -> Response:
        if not server.metrics_up:
            return PlainTextResponse("metrics are down", status_code=503)
        return PlainTextResponse(server.metrics(), media_type="text/plain; version=0.0.4")

    async def set_metrics(request: Request) -> Response:
        server.metrics_up = request.query_params.get("up", "1") == "1"
        return JSONResponse({"metrics_up": server.metrics_up})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def stats(request: Request) -> Response:
        return JSONResponse(server.stats())

    async def reset(request: Request) -> Response:
        server.reset()
        return JSONResponse({"reset": True})

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/_metrics", set_metrics, methods=["POST"]),
        Route("/_health", health, methods=["GET"]),
        Route("/_stats", stats, methods=["GET"]),
        Route("/_reset", reset, methods=["POST"]),
    ])


def main(argv: list[str]) -> None:
    parser = stub_arguments("stubs_vllm", __doc__ or "")
    parser.add_argument("--capacity", type=int, default=32)
    parser.add_argument("--service-ms", type=float, default=160.0)
    parser.add_argument("--model", default="shared-model")
    parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    parser.add_argument("--accept-priority", action="store_true", help="under fcfs, take a priority and ignore it")
    args = parser.parse_args(argv)
    server = Server(args.capacity, args.service_ms / 1000, args.model, args.scheduling_policy == "priority",
                    args.accept_priority)
    serve(build_app(server), args)


if __name__ == "__main__":
    main(sys.argv[1:])
