"""vLLM's own OpenAI serving layer, built the way `vllm run_batch` builds it.

Everything here imports vLLM; `local_engine.backend` imports this module only
inside `start()`, so the core works without the engine extra.

The pieces, each as in vLLM's run_batch (0.26 to 0.33; names that moved between
releases come from `local_engine.vllm_compat`):
- `build_args`: the run_batch command line's namespace (frontend + engine
  args), with the caller's `engine_args` laid over its defaults.
- `build_engine`: `AsyncEngineArgs.from_cli_args` -> `VllmConfig` -> `AsyncLLM`
  (v1 engine), as `build_async_engine_client_from_engine_args` does, but with
  the engine settings of vLLM's offline `LLM` class where engine_args are
  silent (larger batches, no statistics): all our work is batch work.
- `ServingLayer.create`: `init_app_state`, the function `vllm serve` and
  run_batch both use to build `OpenAIServingChat`, `OpenAIServingCompletion`,
  `ServingEmbedding`, `ServingScores`, `OpenAIServingModels`, ...
- `ServingLayer.reply`: one request through the serving object, and the
  response turned into (status code, body) the way run_batch's `run_request`
  does (an `ErrorResponse` keeps its code; an exception goes through
  `create_error_response`; a streaming answer is a 400).
"""

from __future__ import annotations

import contextlib
import json
import threading
from argparse import Namespace
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gateway import tracing
from gateway.config.endpoints import ENDPOINTS
from gateway.domain import Endpoint
from local_engine import cpu_memory, cpu_threads, root_cause, vllm_compat

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

Reply = tuple[int, dict[str, Any]]

STREAM_MESSAGE = "Request must not be sent in stream mode"  # run_batch's words for a streaming answer


# vLLM's offline `LLM` class turns the engine's statistics off unless asked (`disable_log_stats=True`):
# no per-step scheduler stats in the engine core, no per-token stats in the front end, no periodic log
# line, no `vllm:*` metrics. We do the same; `disable_log_stats: false` in engine_args brings them back.
OFFLINE_DISABLE_LOG_STATS = True


def build_args(engine_args: Mapping[str, Any]) -> Namespace:
    """run_batch's argument namespace with `engine_args` applied.

    Where engine_args are silent, the engine is set up as vLLM's offline `LLM`
    class sets it up (`OFFLINE_DISABLE_LOG_STATS`; the batch-size defaults in
    `build_engine`), not as run_batch does.

    Keys are the python names of `vllm run_batch`'s options (`max_model_len`,
    `dtype`, `served_model_name`, `chat_template`, ...); dashes are accepted
    too. An unknown key is a `ValueError`.
    """
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if not engine_args.get("model"):
        raise ValueError("engine_args needs a 'model' (a local path or a Hugging Face model id)")
    parser = vllm_compat.load("make_arg_parser")(FlexibleArgumentParser(prog="batchyard-local-engine"))
    args = parser.parse_args(["--model", str(engine_args["model"]), "-i", "-", "-o", "-"])
    known = vars(args)
    unknown = sorted(k for k in engine_args if k.replace("-", "_") not in known)
    if unknown:
        raise ValueError(f"unknown engine_args for vLLM: {', '.join(unknown)}")
    names = {k.replace("-", "_") for k in engine_args}
    if "disable_log_stats" not in names:
        # vLLM's own traces (`otlp_traces_endpoint`) are built from the per-request stats: kept on for them
        args.disable_log_stats = OFFLINE_DISABLE_LOG_STATS and "otlp_traces_endpoint" not in names
    for key, value in engine_args.items():
        name = key.replace("-", "_")
        if name == "model":
            value = str(value)
        elif name == "served_model_name" and isinstance(value, str):
            value = [value]
        setattr(args, name, value)
    vllm_compat.load("validate_run_batch_args")(args)
    return args


_BUILD_LOCK = threading.Lock()

# vLLM picks `max_num_seqs` / `max_num_batched_tokens` by usage context (`EngineArgs.get_batch_defaults`):
# its offline `LLM` class gets the large ones (CPU 256 / 4096; H100/H200 1024 / 16384), `vllm serve` smaller
# ones, and run_batch (OPENAI_BATCH_RUNNER, in no table) the scheduler's fallback 128 / 2048 on every device.
# Everything we run is batch work, so the engine is configured as the offline class is; a value set in
# engine_args (or on the command line) still wins, since defaults only fill what is unset.
BATCH_DEFAULTS_CONTEXT = "LLM_CLASS"


def build_engine(args: Namespace, chosen: Collection[str] = ()) -> AsyncLLM:
    """Create the v1 `AsyncLLM` (blocking: starts and waits for the engine-core process).

    `chosen`: the engine_args the operator wrote (on a CPU, the KV cache is sized unless they choose it:
    `local_engine.cpu_memory`).

    vLLM's config set-up touches process-wide state, so configs are built one
    at a time. The engine cores then load side by side when each runs in its
    own process (vLLM's default); an in-process core
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) loads its model under process-wide
    "current config" state, so those builds stay one at a time.
    """
    from vllm import envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    in_process = not envs.VLLM_ENABLE_V1_MULTIPROCESSING
    with _BUILD_LOCK if in_process else contextlib.nullcontext():
        with _BUILD_LOCK if not in_process else contextlib.nullcontext():
            engine_args = AsyncEngineArgs.from_cli_args(args)
            vllm_compat.propagate_flash_late_interaction(args, engine_args)
            with cpu_threads.uniproc_by_default(args):
                vllm_config = engine_args.create_engine_config(usage_context=UsageContext(BATCH_DEFAULTS_CONTEXT))
            cpu_memory.size_cpu_kv_cache(vllm_config, chosen)
        with cpu_threads.engine_core_threads(vllm_config), root_cause.captured(vllm_config) as cause:
            try:
                return AsyncLLM.from_vllm_config(
                    vllm_config=vllm_config,
                    usage_context=UsageContext.OPENAI_BATCH_RUNNER,  # what vLLM's usage report says we are
                    enable_log_requests=engine_args.enable_log_requests,
                    aggregate_engine_logging=engine_args.aggregate_engine_logging,
                    disable_log_stats=engine_args.disable_log_stats,
                )
            except Exception as exc:  # the engine-core process's own reason, not "see root cause above"
                told = root_cause.explained(exc, cause)
                if told is exc:
                    raise
                raise told from exc


def shutdown_engine(engine: AsyncLLM) -> None:
    """Stop the engine-core process, with the grace period `vllm serve` and run_batch use."""
    engine.shutdown(timeout=engine.vllm_config.shutdown_timeout)


def error_reply(message: str | Exception, **kwargs: Any) -> Reply:
    """An error reply in vLLM's shape (`create_error_response`: 400 BadRequestError unless told)."""
    err = vllm_compat.load("create_error_response")(message, **kwargs)
    return err.error.code, err.model_dump(mode="json")


@dataclass(slots=True)
class _Route:
    parse: Callable[[dict[str, Any]], Any]
    handler: Callable[..., Any]  # (request) or, for chat and completions, (request, raw_request=...)
    fields: frozenset[str] = frozenset()  # the request model's fields: vLLM ignores others, we refuse them


# the endpoints whose vLLM handlers read `trace_headers` from the request (`raw_request`)
_TRACED = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})


def _carrier(headers: Mapping[str, str]) -> Any:
    """A bare HTTP request holding only `headers`: all vLLM's handlers read of one here (its headers, and its
    `state`, which they write to)."""
    from starlette.requests import Request

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"", "state": {},
             "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]}
    return Request(scope)


def _fields_of(model: Any) -> frozenset[str]:
    """The field names (and aliases) of a pydantic request model, or of every model in a union of them."""
    import typing

    fields = getattr(model, "model_fields", None)
    if isinstance(fields, dict):
        return frozenset(fields) | frozenset(f.alias for f in fields.values() if getattr(f, "alias", None))
    return frozenset().union(*(_fields_of(arg) for arg in typing.get_args(model)))


@dataclass(slots=True)
class ServingLayer:
    """The serving objects of one engine, keyed by endpoint."""

    args: Namespace
    state: Any  # starlette State, as `vllm serve` keeps it on app.state
    routes: dict[Endpoint, _Route]
    served_model_names: tuple[str, ...]
    max_num_seqs: int

    @property
    def endpoints(self) -> frozenset[Endpoint]:
        return frozenset(self.routes)

    def fields(self, url: Endpoint) -> frozenset[str]:
        """The body fields vLLM's request model for `url` takes (empty for an endpoint it does not serve)."""
        route = self.routes.get(url)
        return route.fields if route is not None else frozenset()

    @classmethod
    async def create(cls, engine: AsyncLLM, args: Namespace) -> ServingLayer:
        from pydantic import TypeAdapter
        from starlette.datastructures import State
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
        from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest

        await engine.reset_mm_cache()
        supported_tasks = await engine.get_supported_tasks()
        state = State()
        await vllm_compat.load("init_app_state")(engine, state, args, supported_tasks)

        routes: dict[Endpoint, _Route] = {}
        chat = getattr(state, "openai_serving_chat", None)
        if chat is not None:
            routes[Endpoint.CHAT] = _Route(ChatCompletionRequest.model_validate, chat.create_chat_completion,
                                           _fields_of(ChatCompletionRequest))
        completion = getattr(state, "openai_serving_completion", None)
        if completion is not None:
            routes[Endpoint.COMPLETIONS] = _Route(CompletionRequest.model_validate, completion.create_completion,
                                                  _fields_of(CompletionRequest))
        embedding = getattr(state, "serving_embedding", None)
        if embedding is not None:
            routes[Endpoint.EMBEDDINGS] = _Route(TypeAdapter(EmbeddingRequest).validate_python, embedding,
                                                 _fields_of(EmbeddingRequest))
        scores = getattr(state, "serving_scores", None)
        if scores is not None:
            routes[Endpoint.SCORE] = _Route(TypeAdapter(ScoreRequest).validate_python, scores, _fields_of(ScoreRequest))
            routes[Endpoint.RERANK] = _Route(RerankRequest.model_validate, scores, _fields_of(RerankRequest))

        routes.update(_audio_routes(state, args))
        routes.update(_messages_route(state))
        names = tuple(m.name for m in state.openai_serving_models.base_model_paths)
        return cls(args, state, routes, names, engine.vllm_config.scheduler_config.max_num_seqs)

    async def reply(self, url: Endpoint, body: dict[str, Any]) -> Reply:
        """Run one request; never raises except for cancellation. An Anthropic Messages line's error is in
        Anthropic's shape (`vllm serve` answers `/v1/messages` errors in it too, with vLLM's type names; ours
        are Anthropic's, by status)."""
        status, answer = await self._reply(url, body)
        if url is Endpoint.MESSAGES and status >= 400:
            from gateway.message_batches.wire import anthropic_error

            return status, anthropic_error(status, answer)
        return status, answer

    async def _reply(self, url: Endpoint, body: dict[str, Any]) -> Reply:
        import pydantic

        route = self.routes.get(url)
        if route is None:
            return error_reply(_unsupported_message(url, self.served_model_names))
        if body.get("stream"):
            # run_batch answers a streaming request with a 400; we refuse it before it reaches the engine.
            return error_reply(STREAM_MESSAGE)
        try:
            request = route.parse(body)
        except pydantic.ValidationError as exc:
            return await self._validation_reply(exc)
        except Exception as exc:  # a validator that raises outside pydantic (e.g. vLLM's VLLMValidationError)
            return error_reply(exc)
        headers = tracing.headers() if url in _TRACED else None
        try:
            # the request span's traceparent, where vLLM reads it (`trace_headers`, from the HTTP request's
            # headers): an engine started with `otlp_traces_endpoint` puts its llm_request span below ours
            response = await (route.handler(request, raw_request=_carrier(headers)) if headers
                              else route.handler(request))
        except Exception as exc:  # run_batch: any exception becomes create_error_response(e)
            return error_reply(exc)
        return await _to_reply(response)

    async def _validation_reply(self, exc: Any) -> Reply:
        """A body that does not validate: the 400 `vllm serve` answers (its RequestValidationError handler)."""
        from fastapi.exceptions import RequestValidationError

        errors = [{**err, "loc": ("body", *err.get("loc", ()))} for err in exc.errors(include_url=False)]
        fake_request = SimpleNamespace(app=SimpleNamespace(state=self.state), state=SimpleNamespace())
        handler = vllm_compat.load("validation_exception_handler")
        response = await handler(fake_request, RequestValidationError(errors))
        return response.status_code, json.loads(bytes(response.body))


def _audio_routes(state: Any, args: Namespace) -> dict[Endpoint, _Route]:
    """`/v1/audio/transcriptions` and `/v1/audio/translations`, as run_batch serves them.

    The body carries `file_url` (http(s) or a `data:` URL) instead of an upload;
    run_batch's own request models and wrapper fetch the audio (size-capped,
    `--allowed-media-domains` honoured) and call vLLM's speech-to-text serving.
    """
    routes: dict[Endpoint, _Route] = {}
    transcription = getattr(state, "openai_serving_transcription", None)
    translation = getattr(state, "openai_serving_translation", None)
    if transcription is None and translation is None:
        return routes
    make_transcription_wrapper = vllm_compat.load("make_transcription_wrapper")
    domains = getattr(args, "allowed_media_domains", None)
    if transcription is not None:
        wrap = make_transcription_wrapper(is_translation=False, allowed_media_domains=domains)
        model = vllm_compat.load("BatchTranscriptionRequest")
        routes[Endpoint.TRANSCRIPTIONS] = _Route(model.model_validate, wrap(transcription.create_transcription),
                                                 _fields_of(model))
    if translation is not None:
        wrap = make_transcription_wrapper(is_translation=True, allowed_media_domains=domains)
        model = vllm_compat.load("BatchTranslationRequest")
        routes[Endpoint.TRANSLATIONS] = _Route(model.model_validate, wrap(translation.create_translation),
                                               _fields_of(model))
    return routes


def _messages_route(state: Any) -> dict[Endpoint, _Route]:
    """`/v1/messages` through vLLM's Anthropic serving layer (`AnthropicServingMessages`, built by
    `init_app_state` beside the chat serving object): the request becomes a chat completion and the reply a
    `message`, as `vllm serve` answers it."""
    serving = getattr(state, "anthropic_serving_messages", None)
    if serving is None:
        return {}
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest, AnthropicMessagesResponse

    async def create(request: Any) -> Any:
        response = await serving.create_messages(request)
        if not isinstance(response, AnthropicMessagesResponse):
            return response  # an ErrorResponse (or a stream, refused by `_to_reply`)
        # `vllm serve`'s body (None dropped: the content blocks' unused fields, vLLM's transfer params), with
        # the two keys Anthropic always sends
        message: dict[str, Any] = response.model_dump(mode="json", exclude_none=True)
        message.setdefault("stop_reason", None)
        message.setdefault("stop_sequence", None)
        return message

    return {Endpoint.MESSAGES: _Route(AnthropicMessagesRequest.model_validate, create,
                                      _fields_of(AnthropicMessagesRequest))}


def _unsupported_message(url: Endpoint, names: tuple[str, ...]) -> str:
    model = names[0] if names else "this model"
    never = ENDPOINTS[url].never_local  # no vLLM model serves it: the 400 says where to send it instead
    if never is not None:
        return (f"{url.value} is not served by the local vLLM engine ({never}); route model "
                f"{model!r} to an upstream provider in the config to use it")
    return f"Model does not support endpoint: {url.value}"  # run_batch's words (e.g. chat on an embedding model)


async def _to_reply(response: Any) -> Reply:
    from pydantic import BaseModel
    from starlette.responses import Response, StreamingResponse
    if isinstance(response, dict):  # a body made already (`_messages_route`)
        return 200, response
    if isinstance(response, vllm_compat.load("ErrorResponse")):
        return response.error.code, response.model_dump(mode="json")
    if isinstance(response, BaseModel):
        return 200, response.model_dump(mode="json")
    if isinstance(response, Response) and not isinstance(response, StreamingResponse):
        with contextlib.suppress(ValueError):
            body = json.loads(bytes(response.body))
            if isinstance(body, dict):
                error = body.get("error")
                if isinstance(error, dict) and isinstance(error.get("code"), int):
                    return error["code"], body
                return response.status_code, body
    # An async generator (a stream) or a non-JSON response: run_batch's 400. Close it so vLLM aborts the request.
    close = getattr(response, "aclose", None) or getattr(getattr(response, "body_iterator", None), "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
    return error_reply(STREAM_MESSAGE)
