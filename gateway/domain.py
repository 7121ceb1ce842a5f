"""The words the pipeline passes around: one dataclass per idea.

`BatchRequest` is one input line, `Result` what came of it, `Shard` the unit of
work. The stored batch and file records (the wire objects) are `gateway.store.records`; where a shard's
blobs live is `gateway.store.blobs.keys`.
"""

from __future__ import annotations

import enum
import math
import random
import secrets
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str, sep: str = "_") -> str:
    """An id with 128 random bits from the OS's CSPRNG, OpenAI-style: for what callers name.

    OpenAI's batches are `batch_<hex>` and its files `file-<hex>` (clients check the
    prefix), hence `sep`.
    """
    return f"{prefix}{sep}{secrets.token_hex(16)}"


# The id kind of Anthropic's Message Batches (`msgbatch_…`): the batches of one API family are not the other's.
MESSAGE_BATCH_KIND = "msgbatch"

_fast = random.Random(secrets.randbits(128))


def new_line_id(prefix: str) -> str:
    # Per-request ids (output line and request ids) grant nothing, so they come
    # from a seeded PRNG: a syscall per id showed up in profiles at 20k lines.
    return f"{prefix}_{_fast.getrandbits(128):032x}"


class Endpoint(str, enum.Enum):
    """Canonical endpoints; every url form in a batch file maps to one of these."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    RESPONSES = "/v1/responses"
    SCORE = "/v1/score"
    RERANK = "/v1/rerank"
    MODERATIONS = "/v1/moderations"
    IMAGES = "/v1/images/generations"
    IMAGE_EDITS = "/v1/images/edits"  # the JSON form (`images` by URL or file id), the one a batch line can carry
    TRANSCRIPTIONS = "/v1/audio/transcriptions"
    TRANSLATIONS = "/v1/audio/translations"
    MESSAGES = "/v1/messages"  # Anthropic's Messages: the lines of a Message Batch (gateway.message_batches)


class BatchStatus(str, enum.Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}


@dataclass(slots=True)
class BatchRequest:
    """One input line, validated and normalised."""

    line: int  # 1-based line number in the input file
    custom_id: str
    url: Endpoint
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "custom_id": self.custom_id, "url": self.url.value, "body": self.body}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRequest:
        return cls(line=data["line"], custom_id=data["custom_id"], url=Endpoint(data["url"]), body=data["body"])


# The most tokens one request's reply may report and be counted. No model reads or writes anywhere near a
# billion tokens in one call (the largest context windows are around 10^7); a count past this is a broken or
# hostile upstream, and believing it would put one line's absurd price on the team's spend.
MAX_USAGE_TOKENS = 10**9

_WRONG: dict[str, Any] = {}  # a details object that is not an object (`_details`)


def _details(usage: dict[str, Any], *names: str) -> dict[str, Any] | None:
    """The first of the `*_tokens_details` objects present; `_WRONG` when it is there but not an object."""
    for name in names:
        value = usage.get(name)
        if value is not None:
            return value if isinstance(value, dict) else _WRONG
    return None


def billable(cost: float | None) -> float:
    """What a result's cost may add to a spend or a cost total: a finite amount above zero, else nothing.
    A spend only grows (a new budget period starts a new one); a negative or NaN price cannot move it back."""
    return float(cost) if isinstance(cost, float | int) and math.isfinite(cost) and cost > 0 else 0.0


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0  # of `input_tokens`, those written to a provider's prompt cache (Anthropic's)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cache_write_tokens += other.cache_write_tokens

    @classmethod
    def from_body(cls, body: dict[str, Any] | None) -> Usage:
        """Read token counts from a response body (chat, completions, embeddings, responses or Anthropic's
        `message` shape)."""
        return cls.read(body)[0]

    @classmethod
    def read(cls, body: dict[str, Any] | None) -> tuple[Usage, bool]:
        """The body's token counts, and whether any was refused (counted as zero: a sane count is an int, not
        a bool, in [0, MAX_USAGE_TOKENS]).

        A reply's `usage` is the upstream's word, not the operator's: only sane counts are priced and
        summed into a batch's usage and a team's spend. Absent or null fields are 0 and refuse nothing.
        """
        raw = body.get("usage") if body else None
        if raw is None:
            return cls(), False
        if type(raw) is not dict:
            return cls(), True
        # Written out, not looped through helpers: this runs for every result, a few times (journal, merge).
        inp = raw.get("prompt_tokens")
        if inp is None:
            inp = raw.get("input_tokens")
        out = raw.get("completion_tokens")
        if out is None:
            out = raw.get("output_tokens")
        in_details = _details(raw, "prompt_tokens_details", "input_tokens_details")
        out_details = _details(raw, "completion_tokens_details", "output_tokens_details")
        refused = in_details is _WRONG or out_details is _WRONG
        counts = [0, 0, 0, 0]
        values = (inp, out, None if in_details is None else in_details.get("cached_tokens"),
                  None if out_details is None else out_details.get("reasoning_tokens"))
        for i, value in enumerate(values):
            if value is None:
                continue
            # `type(...) is int` leaves out bools (and floats); JSON gives plain ints
            if type(value) is int and 0 <= value <= MAX_USAGE_TOKENS:
                counts[i] = value
            else:
                refused = True
        if "cache_read_input_tokens" in raw or "cache_creation_input_tokens" in raw:
            # Anthropic's `message` usage: its `input_tokens` leave out the prompt tokens read from and written
            # to the cache; counted here as OpenAI counts them (all in the input, the reads also as cached, the
            # writes also as written). LiteLLM's chat translation of it names both counts beside `prompt_tokens`,
            # which holds them already: there only the writes are read.
            anthropic = "prompt_tokens" not in raw
            counts.append(0)
            for name, into in (("cache_read_input_tokens", (0, 2) if anthropic else ()),
                               ("cache_creation_input_tokens", (0, 4) if anthropic else (4,))):
                value = raw.get(name)
                if value is None:
                    continue
                if type(value) is int and 0 <= value <= MAX_USAGE_TOKENS:
                    for i in into:
                        counts[i] += value
                else:
                    refused = True
        return cls(*counts), refused

    def to_openai(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.total_tokens,
        }


# The error code of a line whose reply still does not match its schema after its re-runs
# (`gateway.pipeline.output_reruns`).
OUTPUT_INVALID = "output_invalid"


@dataclass(slots=True)
class Result:
    """What came of one request.

    A request that got an HTTP reply has `status_code` and `body` (the reply,
    success or the provider's error body). A request that never ran has
    `status_code=None` and `error={"code", "message"}`.
    """

    line: int
    custom_id: str
    status_code: int | None = None
    body: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    request_id: str = field(default_factory=lambda: new_line_id("req"))
    id: str = field(default_factory=lambda: new_line_id("batch_req"))
    model: str = ""  # the caller's model name, for summaries
    # What the request cost, when known (LiteLLM's price for an upstream call, the
    # config's per-token prices otherwise); None: not priced.
    cost_usd: float | None = None
    # Where the result stands in its batch's result log (1, 2, …, in the order results were journaled; 0: never
    # journaled, a line answered at validation): the cursor of `GET /v1/batches/{id}/results` counts by it.
    seq: int = 0
    # Attempts past the first: re-runs of a reply that did not match its request's schema
    # (`gateway.pipeline.output_reruns`); `cost_usd` is that of every attempt.
    reruns: int = 0
    # Token counts of a successful reply, read from its body once, when the result is built (every
    # way of building one, `from_json` included, goes through `__post_init__`): the journal, the
    # counters, route stats, metrics and pricing all read it.
    usage: Usage = field(init=False, repr=False, compare=False)
    # The reply's `usage` held a count that is not sane (`Usage.read`): counted as zero, and reported.
    usage_refused: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        answered = self.status_code is not None and 200 <= self.status_code < 300
        self.usage, self.usage_refused = Usage.read(self.body) if answered and self.error is None else (Usage(), False)

    @property
    def ok(self) -> bool:
        """A 2xx reply with no error of ours: a reply that does not match its schema (`output_invalid`) keeps
        its 2xx response and fails."""
        return self.status_code is not None and 200 <= self.status_code < 300 and self.error is None

    @property
    def output_invalid(self) -> bool:
        """Its reply still did not match its schema after its re-runs (failed with `OUTPUT_INVALID`)."""
        return self.error is not None and self.error.get("code") == OUTPUT_INVALID

    @classmethod
    def failure(cls, req_line: int, custom_id: str, code: str, message: str, model: str = "") -> Result:
        """A request that never ran."""
        return cls(line=req_line, custom_id=custom_id, error={"code": code, "message": message}, model=model)

    @classmethod
    def http_error(
        cls, req_line: int, custom_id: str, status: int, message: str, *, type_: str, code: str | None, model: str = "",
        param: str | None = None,
    ) -> Result:
        """A request answered with an error reply in OpenAI's error shape."""
        body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
        return cls(line=req_line, custom_id=custom_id, status_code=status, body=body, model=model)

    def output_line(self, run_batch_errors: bool = False) -> dict[str, Any]:
        """The line written to the output or error file (OpenAI's batch output shape).

        With `run_batch_errors`, an error reply is written as vLLM's run_batch
        writes it: `response.body` null and the error body in `error`.
        """
        response = None
        error: Any = self.error
        if self.status_code is not None:
            body = self.body
            if run_batch_errors and not self.ok and self.error is None:
                body, error = None, self.body
            response = {"status_code": self.status_code, "request_id": self.request_id, "body": body}
        return {"id": self.id, "custom_id": self.custom_id, "response": response, "error": error}

    def to_json(self) -> dict[str, Any]:
        """The journal form: the output line plus what merging and summaries need."""
        data = self.output_line()
        data["line"] = self.line
        data["model"] = self.model
        if self.cost_usd is not None:
            data["cost_usd"] = self.cost_usd
        if self.seq:
            data["seq"] = self.seq
        if self.reruns:
            data["reruns"] = self.reruns
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        response = data.get("response")
        return cls(
            line=data["line"],
            custom_id=data["custom_id"],
            status_code=response["status_code"] if response else None,
            body=response["body"] if response else None,
            request_id=response["request_id"] if response else "",
            error=data.get("error"),
            id=data["id"],
            model=data.get("model", ""),
            cost_usd=data.get("cost_usd"),
            seq=data.get("seq", 0),
            reruns=data.get("reruns", 0),
        )


@dataclass(slots=True)
class RouteStats:
    """One route's share of a batch, counted as results are recorded (live progress, cost). `reruns`: attempts
    past the first of replies that did not match their schema; `output_invalid`: lines still invalid after them."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    reruns: int = 0
    output_invalid: int = 0

    @property
    def requests(self) -> int:
        return self.completed + self.failed

    def add(self, result: Result) -> None:
        if result.ok:
            self.completed += 1
            usage = result.usage
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
        else:
            self.failed += 1
            self.output_invalid += result.output_invalid
        self.reruns += result.reruns
        self.cost_usd += billable(result.cost_usd)

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "completed": self.completed, "failed": self.failed,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens, "cost_usd": round(self.cost_usd, 10),
                "reruns": self.reruns, "output_invalid": self.output_invalid}


@dataclass(slots=True)
class Shard:
    """Up to N requests of one batch that share one route.

    The unit of work, of distribution across workers and of recovery. Its
    requests live in the blob `requests_key`, in input order.
    """

    batch_id: str
    index: int
    route: str  # the model_name of the route, or "" for the shard of plan-time errors
    size: int
    # Set when the shard is queued (the store's shard table keeps neither): whose it is and when its batch
    # expires, for the queue's fair pick (`gateway.scheduling.fairness`).
    team: str = ""
    deadline: int = 0

    @property
    def key(self) -> str:
        return f"{self.batch_id}:{self.index}"

    def to_json(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "index": self.index, "route": self.route, "size": self.size,
                "team": self.team, "deadline": self.deadline}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shard:
        return cls(batch_id=data["batch_id"], index=data["index"], route=data["route"], size=data["size"],
                   team=data.get("team", ""), deadline=data.get("deadline", 0))
