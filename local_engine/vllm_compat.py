"""Every vLLM name whose module moved between the releases we support: 0.26.0 to 0.33.

The rest of the package imports vLLM's serving internals only through here.
Each name is looked up in its newest home first, then in the older ones, so
the release in between two documented layouts (a patch release) works too. A
module that exists but fails to import for another reason (a dependency
missing) is not skipped: that error is raised as it is.

Where each name lives, read from the wheels of 0.26.0 ... 0.33.0:

| name | 0.26-0.27 | 0.28 | 0.29-0.31 | 0.32 | 0.33 |
|---|---|---|---|---|---|
| run_batch's parser, validator and audio request models | openai.run_batch | same | launchers.run_batch | same | same |
| init_app_state | openai.api_server | same | launchers.api_server.app_state | same | same |
| create_error_response | serve.utils.error_response | serve (re-export) | same | same | same |
| validation_exception_handler | serve.utils.server_utils | serve.exception_handling.handlers.validation | same | ... |
| ErrorResponse | openai.engine.protocol | same | serve.engine.protocol | same | same |
| propagate_flash_late_interaction | absent | absent | absent | launchers.cli_args | common.cli_args |

(all under `vllm.entrypoints.`). Unchanged over the range, imported directly:
`vllm.v1.engine.async_llm.AsyncLLM`, `vllm.engine.arg_utils.AsyncEngineArgs`,
`vllm.usage.usage_lib.UsageContext`, `vllm.utils.argparse_utils.FlexibleArgumentParser`,
`vllm.envs`, `vllm.utils.random_uuid` and the request models of
`vllm.entrypoints.openai.{chat_completion,completion}.protocol` and
`vllm.entrypoints.pooling.{embed,scoring}.protocol`.
"""

from __future__ import annotations

import importlib
from argparse import Namespace
from types import ModuleType
from typing import Any

SUPPORTED = ">=0.26.0,<0.34"  # what the README promises; 0.32.0 is the tested default (CI)

_E = "vllm.entrypoints."


def _optional(name: str) -> ModuleType | None:
    """The module, or None when this vLLM's layout has no such module.

    Only "no such module" is None: a module that exists but fails on a missing
    dependency raises, so a broken install is not mistaken for an older layout.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def _first(*modules: str) -> ModuleType:
    """The first of `modules` that exists (newest layout first)."""
    for name in modules:
        if (module := _optional(name)) is not None:
            return module
    raise ModuleNotFoundError(f"none of {', '.join(modules)} exists in this vLLM (supported: vllm{SUPPORTED})")


def run_batch_module() -> ModuleType:
    """vLLM's run_batch: `make_arg_parser`, `validate_run_batch_args`, `BatchTranscriptionRequest`,
    `BatchTranslationRequest`, `make_transcription_wrapper`.

    0.29 moved it to `launchers.run_batch`; `openai.run_batch` became a deprecated stub that re-runs
    the new one (it no longer defines these names), so the new home is tried first.
    """
    return _first(_E + "launchers.run_batch", _E + "openai.run_batch")


def init_app_state() -> Any:
    """`init_app_state(engine, state, args, supported_tasks)`: builds the serving objects `vllm serve` uses.

    0.29 moved it from `openai.api_server` (which still re-exports it) to `launchers.api_server.app_state`.
    """
    return _first(_E + "launchers.api_server.app_state", _E + "openai.api_server").init_app_state


def create_error_response() -> Any:
    """`create_error_response(message, err_type=..., status_code=..., param=...)` -> `ErrorResponse`.

    0.28 moved it from `serve.utils.error_response` to `serve.exception_handling.error_response` and
    re-exported it as `vllm.entrypoints.serve.create_error_response`.
    """
    module = _first(_E + "serve")
    if hasattr(module, "create_error_response"):
        return module.create_error_response
    return _first(_E + "serve.utils.error_response").create_error_response


def validation_exception_handler() -> Any:
    """`vllm serve`'s handler for a body that does not validate (its 400 and wording).

    0.28 moved it from `serve.utils.server_utils` to `serve.exception_handling.handlers.validation`.
    """
    return _first(_E + "serve.exception_handling.handlers.validation",
                  _E + "serve.utils.server_utils").validation_exception_handler


def error_response_type() -> Any:
    """`ErrorResponse`, the protocol model of an error reply.

    0.29 moved it from `openai.engine.protocol` to `serve.engine.protocol`.
    """
    return _first(_E + "serve.engine.protocol", _E + "openai.engine.protocol").ErrorResponse


def propagate_flash_late_interaction(args: Namespace, engine_args: Any) -> None:
    """Copy `--no-enable-flash-late-interaction` into the engine's `PoolerConfig`, as run_batch does.

    Added in 0.32 (`launchers.cli_args`), moved in 0.33 to `common.cli_args`. Before 0.32 there is no
    such option, so skipping the call is the equivalent.
    """
    for name in (_E + "common.cli_args", _E + "launchers.cli_args"):
        func = getattr(_optional(name), "propagate_flash_late_interaction", None)
        if func is not None:
            func(args, engine_args)
            return


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))
