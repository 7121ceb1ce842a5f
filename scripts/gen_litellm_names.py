"""Write gateway/config/litellm/litellm_names.py, proxy_names.py and deployment_names.py from the pinned LiteLLM.

    python scripts/gen_litellm_names.py          # rewrite both modules from the installed LiteLLM
    python scripts/gen_litellm_names.py --check  # exit 1 if a module differs (tests run this)

proxy_names.py: what each section of LiteLLM's proxy config may hold (`proxy_names()` below), so that a
key LiteLLM knows is named as not applied rather than refused as a typo.

deployment_names.py: what a `model_list` entry's `litellm_params` and `model_info` may hold
(`deployment_names()` below), and the providers LiteLLM places, so that a misspelt key (`api_bse`) is
refused at load instead of being sent upstream.

The names: LiteLLM's own list of its parameters (`litellm.types.utils.all_litellm_params`), the
signatures of its call functions (completion, embedding, responses, images, moderation, rerank) and
the Router's, every `kwargs` key the Router reads, and the fields of its mock-testing params; less
the request fields OpenAI documents (`gateway.lines.body_fields.upstream_fields`), which are
the provider's, not LiteLLM's. The config refuses these in `model_info.allowed_params`, and the
security tests put each of them into a batch line. Written out so that loading a config does not
import LiteLLM (seconds, and a price-map fetch unless told not to).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "gateway" / "config" / "litellm" / "litellm_names.py"
PROXY_TARGET = ROOT / "gateway" / "config" / "litellm" / "proxy_names.py"
DEPLOYMENT_TARGET = ROOT / "gateway" / "config" / "litellm" / "deployment_names.py"


def litellm_names() -> set[str]:
    import litellm
    import litellm.router
    from litellm.types.router import MockRouterTestingParams
    from litellm.types.utils import all_litellm_params

    names = set(all_litellm_params)
    calls = [litellm.completion, litellm.acompletion, litellm.embedding, litellm.aembedding, litellm.text_completion,
             litellm.atext_completion, litellm.responses, litellm.aresponses, litellm.image_generation,
             litellm.aimage_generation, litellm.moderation, litellm.amoderation, litellm.rerank, litellm.arerank,
             litellm.Router.__init__]
    router_calls = ("acompletion", "aembedding", "atext_completion", "aresponses", "aimage_generation", "amoderation",
                    "arerank")
    calls += [getattr(litellm.Router, n) for n in router_calls if hasattr(litellm.Router, n)]
    for call in calls:
        names |= {p.name for p in inspect.signature(call).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    source = Path(inspect.getfile(litellm.router)).read_text()
    names |= set(re.findall(r"""kwargs(?:\.get|\.pop|\.setdefault)?[\[(]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""", source))
    names |= set(getattr(MockRouterTestingParams, "model_fields", {}) or MockRouterTestingParams.__annotations__)
    names.discard("self")
    return names


def openai_fields() -> set[str]:
    sys.path.insert(0, str(ROOT))
    from gateway.domain import Endpoint
    from gateway.lines.body_fields import upstream_fields

    return set().union(*(upstream_fields(e) for e in Endpoint))


def _proxy_reads(proxy: Path, variable: str) -> set[str]:
    """Every `variable.get("X")` / `variable["X"]` of LiteLLM's proxy package, helper methods included."""
    pattern = re.compile(rf"""(?<![\w.]){variable}(?:\.get\(|\[)\s*["']([A-Za-z_]\w*)["']""")
    return {name for source in sorted(proxy.rglob("*.py")) for name in pattern.findall(source.read_text())}


def proxy_names() -> dict[str, set[str]]:
    """The keys of each section of LiteLLM's proxy config, read from the pinned LiteLLM.

    The proxy package is read as text, not imported (it needs the proxy extras, which batchyard does not
    install). Every place the proxy reads its config counts, not only `ProxyConfig.load_config`:
    - top level: `ConfigYAML`'s fields, every `config.get("X")` / `config["X"]` of proxy_server.py (its
      helper methods read `credential_list`, `mcp_servers`, `search_tools`, `policies`, ...), and `include`;
    - general_settings: `ConfigGeneralSettings`' fields and every `general_settings.get("X")` / `["X"]` of
      the proxy package;
    - litellm_settings: the keys load_config treats apart (`key == "X"`), every `litellm_settings.get("X")`
      of the proxy package, and the `litellm` module's own settings (what load_config's final
      `setattr(litellm, key, value)` sets): its public names that are no module, class or function;
    - the callbacks the proxy starts itself (`callback == "X"` in `initialize_callbacks_on_proxy`: guardrails,
      interceptions, moderations), which are no logging callback of the `litellm` module.
    """
    import types

    import litellm
    from litellm.proxy._types import ConfigGeneralSettings, ConfigYAML

    proxy = Path(inspect.getfile(litellm)).parent / "proxy"
    server = (proxy / "proxy_server.py").read_text()
    found = re.search(r"\n    async def load_config\(self.*?(?=\n    (?:async )?def )", server, re.S)
    if found is None:
        raise SystemExit("ProxyConfig.load_config not found in litellm/proxy/proxy_server.py")
    load_config = found.group(0)
    top = set(re.findall(r"""(?<![\w.])config(?:\.get\(|\[)\s*["']([A-Za-z_]\w*)["']""", server))
    top -= {"force_reload", "interval_hours"}  # a DB row's keys read through the same name, no section
    top |= set(ConfigYAML.model_fields) | {"include"}
    general = set(ConfigGeneralSettings.model_fields) | _proxy_reads(proxy, "general_settings")
    module = {name for name, value in vars(litellm).items()
              if not name.startswith("_") and not callable(value) and not isinstance(value, types.ModuleType | type)}
    module |= set(re.findall(r"""key == ["']([A-Za-z_]\w*)["']""", load_config))
    module |= _proxy_reads(proxy, "litellm_settings")
    callbacks_source = (proxy / "common_utils" / "callback_utils.py").read_text()
    callbacks = set(re.findall(r"""callback == ["']([A-Za-z_]\w*)["']""", callbacks_source))
    return {"CONFIG_SECTIONS": top, "GENERAL_SETTINGS": general, "LITELLM_MODULE_SETTINGS": module,
            "PROXY_CALLBACKS": callbacks}


def _provider_params(llms: Path) -> set[str]:
    """The settings LiteLLM's provider configs take: each `*Config` class's `__init__` parameters and the
    names its `get_supported_openai_params` lists (read as text: importing every provider takes minutes)."""
    import ast

    names: set[str] = set()
    for source in sorted(llms.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.ClassDef) or not node.name.endswith("Config"):
                continue
            for item in node.body:
                if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if item.name == "__init__":
                    args = [*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs]
                    names |= {a.arg for a in args if a.arg != "self"}
                elif item.name == "get_supported_openai_params":
                    names |= {c.value for c in ast.walk(item) if isinstance(c, ast.Constant)
                              and isinstance(c.value, str) and re.fullmatch(r"[a-z_][a-z0-9_]*", c.value)}
    return names


def deployment_names() -> dict[str, set[str]]:
    """What a deployment's `litellm_params` and `model_info` may hold, and the providers LiteLLM places.

    - litellm_params: every keyword LiteLLM reads (`litellm_names()`), its deployment params' fields
      (`GenericLiteLLMParams`), OpenAI's request fields (a deployment may fix `temperature`), and its provider
      configs' settings (`_provider_params`: `top_k`, `thinking`, ...);
    - model_info: the Router's `ModelInfo` fields, every key of LiteLLM's price map (prices, `mode`,
      `supports_*`), `ModelInfoBase`'s keys, and every `model_info.get("X")` of the Router's and the proxy's
      packages (and every `litellm_params.get("X")` there counts for litellm_params);
    - providers: `LlmProviders`' values (what `provider/` may say).
    """
    import litellm
    from litellm.types.router import GenericLiteLLMParams, ModelInfo
    from litellm.types.utils import LlmProviders, ModelInfoBase

    package = Path(inspect.getfile(litellm)).parent
    params = litellm_names() | set(GenericLiteLLMParams.model_fields) | openai_fields()
    params |= _provider_params(package / "llms")
    prices = json.loads((package / "model_prices_and_context_window_backup.json").read_text())
    info = set(ModelInfo.model_fields) | set(ModelInfoBase.__annotations__)
    info |= {key for value in prices.values() if isinstance(value, dict) for key in value}
    router = [package / "router.py", *(source for folder in ("router_utils", "router_rust", "router_strategy")
                                       for source in (package / folder).rglob("*.py"))]
    for source in sorted([*router, *(package / "proxy").rglob("*.py")]):
        text = source.read_text()
        # the Router's code names a deployment's model_info `info` or `mi_dict` too (its adaptive router's
        # `adaptive_router_preferences`); the proxy's `info` is many other things
        names = r"\w*model_info\w*|info|mi_dict" if source in router else r"\w*model_info\w*"
        info |= set(re.findall(rf"""(?<![\w.])(?:{names})(?:\.get\(|\[)\s*["']([A-Za-z_]\w*)["']""", text))
        params |= set(re.findall(r"""litellm_params(?:\.get\(|\[)\s*["']([A-Za-z_]\w*)["']""", text))
    return {"LITELLM_PARAMS": params, "MODEL_INFO": info, "PROVIDERS": {p.value for p in LlmProviders}}


def _packed(names: set[str]) -> str:
    lines, line = [], "   "
    for name in sorted(names):  # packed to the project's line length
        if len(line) + len(repr(name)) + 2 > 116:
            lines.append(line)
            line = "   "
        line += f" {name!r},"
    lines.append(line)
    return "frozenset({\n" + "\n".join(lines) + "\n})\n"


def _version() -> str:
    import litellm

    return getattr(litellm, "version", None) or __import__("importlib.metadata").metadata.version("litellm")


def render() -> str:
    return (
        f'"""Every keyword LiteLLM {_version()} reads for itself (less OpenAI\'s request fields).\n\n'
        "Generated by scripts/gen_litellm_names.py; do not edit. A batch line may carry none of them, and\n"
        "`model_info.allowed_params` may not list them.\n"
        '"""\n\nLITELLM_SETTINGS = ' + _packed(litellm_names() - openai_fields())
    )


def render_proxy() -> str:
    sections = proxy_names()
    return (
        f'"""The keys of LiteLLM {_version()}\'s proxy config, section by section.\n\n'
        "Generated by scripts/gen_litellm_names.py; do not edit. A key named here is LiteLLM's: where batchyard\n"
        "does not apply it, loading names it (gateway.config.litellm.notices) instead of refusing it as a typo.\n"
        '"""\n' + "".join(f"\n{name} = {_packed(names)}" for name, names in sections.items())
    )


def render_deployment() -> str:
    sections = deployment_names()
    return (
        f'"""What a model_list entry of LiteLLM {_version()} may hold: `litellm_params` and `model_info` keys,\n'
        "and the providers LiteLLM places.\n\n"
        "Generated by scripts/gen_litellm_names.py; do not edit. A key outside these (and batchyard's own,\n"
        "gateway.config.litellm.deployment_keys) is refused at load with the closest name.\n"
        '"""\n' + "".join(f"\n{name} = {_packed(names)}" for name, names in sections.items())
    )


def main(argv: list[str] | None = None) -> int:
    outputs = {TARGET: render(), PROXY_TARGET: render_proxy(), DEPLOYMENT_TARGET: render_deployment()}
    if "--check" in (sys.argv[1:] if argv is None else argv):
        stale = [target for target, text in outputs.items() if not target.exists() or target.read_text() != text]
        for target in stale:
            print(f"{target.relative_to(ROOT)} differs from the installed LiteLLM; run scripts/gen_litellm_names.py")
        return 1 if stale else 0
    for target, text in outputs.items():
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
