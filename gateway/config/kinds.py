"""What kind a deployment is, below both the entries that validate it and the routes made of them: its
route kind (`RouteKind`), whether its provider runs native batch jobs (`native_refusal`), and the provider
LiteLLM infers for a model name without a `provider/` prefix (`inferred_provider`).
"""

from __future__ import annotations

import enum

from gateway.config.native_declarations import native_declarations


def native_refusal(model: str) -> str | None:
    """Why a deployment of `model` (`provider/name`) cannot be `batch_mode: native`; None when it can.

    Checked at load: a native route on another provider would otherwise have every line fail, or be
    quietly run in real time at twice the price."""
    provider = model.partition("/")[0]
    declared = native_declarations()
    if provider in declared:
        return None
    return (f"native batches run on {', '.join(sorted(declared))} deployments, not {provider}/ (a host that "
            "serves OpenAI's Batch API runs them as an openai/ deployment with that host's api_base; else use "
            "batch_mode: realtime)")


class RouteKind(str, enum.Enum):
    LOCAL = "local"
    UPSTREAM = "upstream"
    NATIVE = "native"


def inferred_provider(model: str) -> str | None:
    """The provider LiteLLM gives a model name without a `provider/` prefix; None when it knows none.

    Imports LiteLLM (seconds): only called for a name no exact route or pattern takes as written, or an
    entry whose model has no prefix."""
    import litellm
    from litellm.litellm_core_utils.get_llm_provider_logic import inferred_provider as infer

    litellm.suppress_debug_info = True  # get_llm_provider prints a banner on an unknown name otherwise
    return infer(model)


__all__ = ["RouteKind", "inferred_provider", "native_refusal"]
