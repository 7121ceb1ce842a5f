"""The contract a provider's batch jobs fill in (`UpstreamJobs`, one subclass per provider), and what they share.

`NativeBatchBackend` (`providers.native.runner`) plans, records and reads back; an `UpstreamJobs` knows one
provider's batch API: the request line it takes, how a part becomes a job (upload and create, or one create
call), how a job is polled, cancelled and read back as OpenAI-shaped result lines. Each goes through LiteLLM's
batch functions where LiteLLM 1.110.2 reaches the provider, and over plain HTTP (LiteLLM's own URL and header
helpers) for the calls it lacks (Anthropic's create and cancel, Mistral's cancel and list).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from gateway.domain import BatchRequest, Endpoint, Result, Usage
from providers.native.openai_format import Part, reply_lines
from providers.upstream_errors import error_message

if TYPE_CHECKING:
    from gateway.config.entries import NativeModelInfo

Save = Callable[[], Awaitable[None]]

# LiteLLM's success logging of a terminal `aretrieve_batch` downloads the whole output file again to price it
# (OpenAI, Azure, Mistral; Anthropic's results too): its proxy's batch poller turns that off with this flag, and so
# do we (we read the results once, streamed). Pass it as `litellm_metadata`.
QUIET_POLL = {"batch_ignore_default_logging": True}


@dataclass(slots=True)
class JobState:
    """A polled upstream job, in OpenAI's status words (`TERMINAL` ones end the polling).

    `files`: what `results` reads; `why`: the provider's reason for a failed job; `code`: the error code of
    the lines a job ended without answering (None: the usual `batch_expired`, `batch_cancelled`...)."""

    status: str
    files: list[str] = field(default_factory=list)
    why: str = ""
    code: str | None = None


class UpstreamJobs:
    """One provider's batch API, bound to one deployment (its model and credentials): the class a provider's
    `*_jobs.py` fills in. `providers.native.catalog` finds every subclass that names its `providers`.

    What the class declares, read before any deployment exists (the config checks a native entry against it,
    handed in by the composition root; the runner splits and routes by it):
    - `providers`: the LiteLLM provider prefixes it serves (`openai`, `azure`);
    - `endpoints`: what its jobs take (the provider's limits on one job are in `providers.native.job_limits`);
    - `settings`: its own `native_*` keys of `model_info` (refused on every other provider), `required_settings`
      (of those, the ones a deployment must set, `settings_purpose` saying what they are) and `model_refusal`
      (the models of the provider its jobs cannot run);
    - `credentials`: the `litellm_params` its calls take (keys, bases, regions): nothing else reaches them;
    - `completion_windows`: the hours (least, most) a `native_completion_window` may ask of the provider (None:
      whatever the host takes, its own refusal saying otherwise); `batch_discount`: a batch's share of the
      real-time price where no batch price is known (None: only batch prices count, else the line is unpriced).

    The optional abilities have defaults, as httpx's transports default `close`: `min_lines` (a part with
    fewer lines runs in real time through `realtime`), `release` (drop what was kept for the jobs' creation),
    `prime` (real-time calls before a job that write a prompt cache its requests share).
    """

    providers: ClassVar[tuple[str, ...]] = ()
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset()
    settings: ClassVar[frozenset[str]] = frozenset()
    required_settings: ClassVar[tuple[str, ...]] = ()
    settings_purpose: ClassVar[str] = ""
    credentials: ClassVar[tuple[str, ...]] = ("api_base", "api_key", "api_version", "organization")
    completion_windows: ClassVar[tuple[int, int] | None] = None
    batch_discount: ClassVar[float | None] = 0.5  # OpenAI, Azure, Anthropic, Mistral, Google, Bedrock: half
    min_lines: int = 0  # a part below it runs in real time (`realtime`); 0: every part is a job

    provider: str  # the deployment's provider (one of `providers`)

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        """`kwargs`: the deployment's LiteLLM keyword arguments (`call_kwargs`); `info`: its `model_info`, whose
        `settings` a provider reads here."""
        self.provider = provider
        self._litellm = litellm
        self._model = model
        self._kwargs = kwargs

    @classmethod
    def model_refusal(cls, model: str) -> str | None:
        """Why this provider's jobs cannot run `model` (the part after `provider/`); None: they can."""
        return None

    def url(self, endpoint: Endpoint) -> str:
        """The job endpoint a request goes to (requests of one part share it)."""
        raise NotImplementedError

    def line(self, req: BatchRequest) -> bytes:
        """The request as one line of the provider's job input (its size counts against the job's bytes)."""
        raise NotImplementedError

    def reject(self, req: BatchRequest) -> Result | None:
        """The error result of a request the provider's job cannot take (before any job is made)."""
        raise NotImplementedError

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        """Make the part's job from its lines (`data`), setting `part.file_id`/`part.batch_id` and calling
        `save` as soon as each exists; raises on failure."""
        raise NotImplementedError

    async def find(self, part: Part) -> bool:
        """A job created from `part.file_id` before a crash could record it: set `part.batch_id` if found."""
        raise NotImplementedError

    async def retrieve(self, batch_id: str) -> JobState:
        raise NotImplementedError

    def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        """The finished job's result lines in OpenAI's batch output shape (`custom_id`, `response` or `error`)."""
        raise NotImplementedError

    async def cancel(self, batch_id: str) -> None:
        raise NotImplementedError

    async def realtime(self, req: BatchRequest) -> Result:
        """A line of a part below `min_lines`, answered by one real-time call on the same deployment."""
        raise NotImplementedError(f"{type(self).__name__} sets no min_lines, so it runs no line in real time")

    def release(self) -> None:
        """The shard's jobs exist: drop what was kept only to make them (nothing by default)."""

    async def prime(self, data: bytes) -> list[Usage]:
        """Real-time calls made before the job of these lines (`data`, as `create` gets them) so that its
        requests read a prompt cache they share (Anthropic's: `providers.native.cache_priming`); the usage of
        each call that was answered, priced by the runner at real-time rates. None by default."""
        return []


class TranslatedLines(UpstreamJobs):
    """Each request's job line translated once per shard (the base of the `UpstreamJobs` whose lines LiteLLM
    translates: Anthropic, Gemini, Vertex AI, Bedrock).

    `reject` translates a line to learn whether LiteLLM refuses it, planning sizes it and creating sends it: three
    uses of one translation, which costs milliseconds a line (LiteLLM's parameter mapping). `providers.native.runner`
    calls `release` once the shard's jobs exist, so the lines are not held while the jobs are polled."""

    def _translate(self, req: BatchRequest) -> bytes:
        raise NotImplementedError

    def line(self, req: BatchRequest) -> bytes:
        cache: dict[int, bytes] = self.__dict__.setdefault("_translated", {})
        encoded = cache.get(req.line)
        if encoded is None:
            encoded = cache[req.line] = self._translate(req)
        return encoded

    def release(self) -> None:
        self.__dict__.pop("_translated", None)


class UpstreamHTTPError(Exception):
    """A provider's non-2xx reply to a call LiteLLM does not make for us (status and the provider's message)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code} {message}")
        self.status_code = status_code
        self.message = message


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every call below: making one loads the CA bundle, tens of ms of CPU, and each call
    has a client of its own (a poll every few seconds per job adds up)."""
    return httpx.create_ssl_context()


@functools.cache
def stand_in_reply() -> httpx.Response:
    """The HTTP reply LiteLLM's reply translations take with a result read from a batch file: one, shared (they
    read its status and headers only; making one per line was a tenth of a Gemini result's CPU)."""
    return httpx.Response(200)


def provider_client(timeout: float | None) -> httpx.AsyncClient:
    """An HTTP client for one call to a provider (the shared TLS context; 600 s unless the deployment says)."""
    return httpx.AsyncClient(timeout=timeout or 600.0, verify=_tls())


async def http_json(method: str, url: str, headers: Mapping[str, str], timeout: float | None,
                    content: bytes | None = None, params: Mapping[str, str] | None = None) -> Any:
    """One call to a provider (`content`: a JSON body, sent as is); its JSON reply. A non-2xx reply raises
    `UpstreamHTTPError` with its status."""
    async with provider_client(timeout) as client:
        reply = await client.request(method, url, headers=dict(headers), content=content, params=params)
    if reply.status_code >= 400:
        raise UpstreamHTTPError(reply.status_code, error_message(reply))
    return reply.json()


async def http_lines(url: str, headers: Mapping[str, str], timeout: float | None) -> AsyncIterator[bytes]:
    """A provider's JSONL download, line by line as it arrives (flat memory, whatever the file's size).

    LiteLLM 1.110.2 streams file content for OpenAI-compatible providers only; for the others it holds the
    whole file, which for a job of 100,000 or 1,000,000 results is hundreds of MB at once."""
    async with provider_client(timeout) as client, client.stream(
            "GET", url, headers=dict(headers)) as reply:
        if reply.status_code >= 400:
            await reply.aread()
            raise UpstreamHTTPError(reply.status_code, error_message(reply))
        async for line in reply_lines(reply.aiter_bytes()):
            yield line




def call_kwargs(params: Mapping[str, Any], jobs: type[UpstreamJobs], provider: str,
                timeout: float | None) -> dict[str, Any]:
    """The LiteLLM keyword arguments of a deployment's batch calls: the credentials its jobs class declares and
    the timeout (credentials never logged)."""
    kwargs: dict[str, Any] = {"custom_llm_provider": provider}
    for name in (*jobs.credentials, "timeout"):
        if params.get(name) is not None:
            kwargs[name] = params[name]
    if "timeout" not in kwargs and timeout is not None:
        kwargs["timeout"] = timeout
    return kwargs


def translation_refusal(req: BatchRequest, supported: Collection[str], service: str,
                        translate: Callable[[dict[str, Any]], Any]) -> Result | None:
    """A chat line a translated native route cannot send (Gemini, Bedrock): a body field other than `model` and
    `messages` the provider has no counterpart for, or messages LiteLLM's translation (`translate`) refuses,
    in its own words; that line's 400 before any job is created. None: the line can go."""
    unknown = sorted(k for k in req.body if k not in ("model", "messages") and k not in supported)
    if unknown:
        param, message, code = (unknown[0], f"{unknown[0]} is not supported by {service} batches",
                                "unsupported_parameter")
    else:
        try:
            translate(req.body)
            return None
        except Exception as exc:  # LiteLLM's translation refuses it: its own words
            param, message, code = "messages", str(getattr(exc, "message", None) or exc), "invalid_value"
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return Result(line=req.line, custom_id=req.custom_id, status_code=400, body=body, model=req.model)
