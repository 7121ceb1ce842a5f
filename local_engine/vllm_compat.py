"""Every vLLM name whose module moved between the releases we support: 0.26.0 to 0.33.

The rest of the package imports vLLM's moved serving internals only through
here (`load(name)`). Each name is looked up in its newest home first, then in
the older ones: the first module that exists and defines it wins, so a release
between two documented layouts (a patch release) works too. A module that
exists but fails to import for another reason (a dependency missing) is not
skipped: that error is raised as it is. `scripts/check_vllm_layout.py` checks
the table below against a release's wheel without installing it.

The names that did not move over the range (`UNCHANGED`) are imported directly
where they are used.
"""

from __future__ import annotations

import importlib
from argparse import Namespace
from types import ModuleType
from typing import Any

SUPPORTED = ">=0.26.0,<0.34"  # what the README promises; 0.32.0 is the tested default (CI)
PREFIX = "vllm.entrypoints."

_RUN_BATCH = (
    # 0.29 moved run_batch to launchers/; openai.run_batch became a deprecated stub that no longer defines these.
    "launchers.run_batch",
    "openai.run_batch",  # 0.26 - 0.28
)

# name -> the modules (under vllm.entrypoints.) that define it, newest layout first.
HOMES: dict[str, tuple[str, ...]] = {
    "make_arg_parser": _RUN_BATCH,
    "validate_run_batch_args": _RUN_BATCH,
    "BatchTranscriptionRequest": _RUN_BATCH,
    "BatchTranslationRequest": _RUN_BATCH,
    "make_transcription_wrapper": _RUN_BATCH,
    "init_app_state": (
        "launchers.api_server.app_state",  # 0.29 -> (openai.api_server still re-exports it)
        "openai.api_server",  # 0.26 - 0.28
    ),
    "create_error_response": (
        "serve",  # 0.28 -> : defined in serve.exception_handling.error_response, re-exported by the package
        "serve.utils.error_response",  # 0.26 - 0.27 (the package exists there too, without the name)
    ),
    "validation_exception_handler": (
        "serve.exception_handling.handlers.validation",  # 0.28 ->
        "serve.utils.server_utils",  # 0.26 - 0.27
    ),
    "ErrorResponse": (
        "serve.engine.protocol",  # 0.29 ->
        "openai.engine.protocol",  # 0.26 - 0.28
    ),
}

# module -> names, the same in every release of the range (imported directly; listed for the checker).
UNCHANGED: dict[str, tuple[str, ...]] = {
    "vllm.v1.engine.async_llm": ("AsyncLLM",),
    "vllm.engine.arg_utils": ("AsyncEngineArgs", "EngineArgs"),
    "vllm.usage.usage_lib": ("UsageContext",),
    "vllm.utils.argparse_utils": ("FlexibleArgumentParser",),
    "vllm.utils": ("random_uuid",),
    "vllm.utils.ompmultiprocessing": ("OMPProcessManager",),  # local_engine.cpu_threads
    "vllm.entrypoints.openai.chat_completion.protocol": ("ChatCompletionRequest",),
    "vllm.entrypoints.openai.completion.protocol": ("CompletionRequest",),
    "vllm.entrypoints.pooling.embed.protocol": ("EmbeddingRequest",),
    "vllm.entrypoints.pooling.scoring.protocol": ("RerankRequest", "ScoreRequest"),
}

# Names some releases lack altogether: `optional(name)` is None there.
OPTIONAL_HOMES: dict[str, tuple[str, ...]] = {
    # Copies --no-enable-flash-late-interaction into the engine's PoolerConfig. Added in 0.32
    # (launchers.cli_args), moved in 0.33 (common.cli_args). Before 0.32 there is no such option,
    # so not calling it is the equivalent.
    "propagate_flash_late_interaction": ("common.cli_args", "launchers.cli_args"),
}


def _module(name: str) -> ModuleType | None:
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


def _find(name: str, homes: tuple[str, ...]) -> Any | None:
    for home in homes:
        module = _module(PREFIX + home)
        if module is not None and hasattr(module, name):
            return getattr(module, name)
    return None


def load(name: str) -> Any:
    """A moved vLLM name (a key of `HOMES`) from the installed release."""
    found = _find(name, HOMES[name])
    if found is None:
        where = ", ".join(PREFIX + h for h in HOMES[name])
        raise ImportError(f"vLLM's {name} is in none of {where}: this vLLM is not one batchyard supports "
                          f"(vllm{SUPPORTED})")
    return found


def optional(name: str) -> Any | None:
    """A name of `OPTIONAL_HOMES`, or None in the releases that lack it."""
    return _find(name, OPTIONAL_HOMES[name])


def propagate_flash_late_interaction(args: Namespace, engine_args: Any) -> None:
    """As run_batch does from 0.32 on; nothing to do before (the option does not exist)."""
    func = optional("propagate_flash_late_interaction")
    if func is not None:
        func(args, engine_args)
