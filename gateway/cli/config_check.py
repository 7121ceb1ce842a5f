"""`batchyard config check FILE`: load a config as `serve` would and say what it does.

No network, no engine started, nothing written: the file is loaded (includes merged, environment_variables
set, every key checked, each local model's path there) and LiteLLM's Router built as `run` and serve's
workers build it (`check_router`), then each model_name is printed with its route kind (local, pass-through,
LiteLLM, native; a `batch_mode: background` route marked so), provider, limits and prices, then the LiteLLM
settings batchyard does not apply.
Exit status 0, or 2 with the error.

The printer takes one `RouteRow` per model name (`route_rows`), so a route of another shape (a wildcard,
an alias) is one more row builder, not a new printer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from gateway.config.litellm.litellm_settings import CALLBACK_KEYS
from gateway.config.litellm.notices import notice_text
from gateway.config.local_paths import missing_paths
from gateway.config.routes import Route, RouteKind
from gateway.config.schema import Config, load_config
from gateway.config.wildcards import hidden_aliases
from gateway.errors import ConfigError

EXIT_OK, EXIT_CONFIG = 0, 2
_LIMITS = ("rpm", "tpm", "max_parallel_requests")


@dataclass(frozen=True, slots=True)
class RouteRow:
    """One model name of the config as `config check` prints it."""

    model_name: str
    kind: str  # local, pass-through, LiteLLM, native; "(background)" after a batch_mode: background route's
    provider: str  # the deployments' providers, comma-separated
    rpm: int | None  # per window, all deployments together; None: unbounded
    tpm: int | None
    max_parallel: int | None
    prices: str  # USD per 1M tokens in / out, as the route charges them (a native route: batch prices; "-": none known)


def add_parser(sub: Any) -> None:
    config = sub.add_parser("config", help="check a config file",
                            description="Work with a LiteLLM-style config file without starting anything.")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check", help="load a config as serve would and print its routes and the settings it does not apply",
        description="Load FILE as `batchyard serve` would (includes merged, environment_variables set, every key "
        "checked, a local model's path checked to be a directory, LiteLLM's Router built; no network, no engine "
        "started) and print each model_name with its route kind (local, pass-through, LiteLLM, native; a "
        "batch_mode: background route marked so), provider, "
        "limits (rpm, tpm, max_parallel_requests of its deployments together) and prices (USD per 1M input / "
        "output tokens, as its lines are charged: a native route's at batch rates), then the LiteLLM settings "
        "batchyard does not apply. Exit status 0, or 2 with the error.",
    )
    check.add_argument("file", metavar="FILE", help="the config file (LiteLLM-style YAML)")
    check.add_argument("--strict-config", action="store_true",
                       help="fail (exit status 2) when the file holds LiteLLM settings batchyard does not apply, as "
                       "serve --strict-config would (default: list them)")


def _deployment_limit(sources: Sequence[dict[str, Any]], key: str) -> int | None:
    """A deployment's limit where the Router reads it: in litellm_params, beside them, or in model_info."""
    for source in sources:
        value = source.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _total(values: Sequence[int | None]) -> int | None:
    """The deployments' bound together: the sum, or None (unbounded) when one of them has none."""
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def _prices(route: Route) -> str:
    """The prices each deployment's lines are charged: a native deployment's at batch rates (the rule of
    `gateway.config.prices.batch_prices`, as the native runner prices its results)."""
    from gateway.config.prices import BATCH_PRICE_KEYS as _BATCH_KEYS
    from gateway.config.prices import Prices, batch_prices, deployment_prices, route_prices
    from gateway.lines.tokens import price_map, price_names

    found = []
    charged: list[Prices | None]
    if route.kind is RouteKind.LOCAL:
        charged = [route_prices(d.get("model_info") or {}) for d in route.model_list()]
    elif route.kind is RouteKind.NATIVE:
        cost = price_map()
        charged = [batch_prices(entry.model_info.litellm_keys, cost, names, route.batch_discount(i))
                   for i, (entry, names) in enumerate(zip(route.entries, price_names(route), strict=True))]
    else:
        charged = [deployment_prices(d) for d in route.model_list()]
    for prices, entry in zip(charged, route.entries, strict=True):
        text = f"{prices.input * 1e6:g} / {prices.output * 1e6:g}" if prices is not None else "-"
        keys = entry.model_info.litellm_keys
        if prices is None and route.kind is not RouteKind.LOCAL and any(k in keys for k in _BATCH_KEYS):
            # priced by batch prices only: a line sent in real time has no price, its batch price is shown
            text = (f"- (batches {float(keys.get(_BATCH_KEYS[0]) or 0) * 1e6:g} / "
                    f"{float(keys.get(_BATCH_KEYS[1]) or 0) * 1e6:g})")
        if text not in found:
            found.append(text)
    return ", ".join(found)


def route_row(route: Route, kind: str) -> RouteRow:
    deployments = route.model_list()
    providers = []
    limits: dict[str, list[int | None]] = {key: [] for key in _LIMITS}
    for deployment in deployments:
        params = deployment.get("litellm_params") or {}
        provider = str(params.get("model", "")).partition("/")[0] or "-"
        if provider not in providers:
            providers.append(provider)
        for key in _LIMITS:
            limits[key].append(_deployment_limit((params, deployment, deployment.get("model_info") or {}), key))
    return RouteRow(route.model_name, kind, ", ".join(providers), _total(limits["rpm"]), _total(limits["tpm"]),
                    _total(limits["max_parallel_requests"]), _prices(route))


def check_router(config: Config) -> None:
    """Build LiteLLM's Router of the config's upstream routes as `run` and serve's workers build it (no network);
    raises `ConfigError` with what it refuses. Imports LiteLLM: only a config with upstream routes pays."""
    from providers.litellm_backend import router_kwargs
    from providers.litellm_setup import build_router

    seen: set[str] = set()
    model_list = []
    for route in config.routes.values():
        if route.kind is RouteKind.UPSTREAM and route.model_name not in seen:
            seen.add(route.model_name)
            model_list += route.model_list()
    if model_list:  # its callbacks are not started: a logger's client may open connections at start
        settings = {k: v for k, v in config.litellm_settings.items() if k not in CALLBACK_KEYS}
        build_router(model_list, router_kwargs(config.router_settings, config.litellm_settings), settings,
                     config.path)


def check_router_apart(config: Config) -> None:
    """`check_router` in a child process, for serve: its API process never imports LiteLLM (its workers build
    the Router), and a config the Router refuses would have them exit and restart while serve ran on. The
    child exits 2 with the `ConfigError`'s path, key and problem on stdout, one JSON object."""
    if not any(route.kind is RouteKind.UPSTREAM for route in config.routes.values()):
        return
    # -P: the installed package, never a `gateway/` folder in the current directory (as the workers)
    proc = subprocess.run([sys.executable, "-P", "-m", "gateway.cli.config_check", str(config.path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode == EXIT_CONFIG:
        said = json.loads(proc.stdout)
        raise ConfigError(said["path"], said["key"], said["problem"])
    if proc.returncode != EXIT_OK:
        raise RuntimeError(f"building LiteLLM's Router failed: {proc.stderr.strip()[-2000:]}")


def route_rows(config: Config) -> list[RouteRow]:
    """One row per model name of `config.routes`, in name order."""
    from providers.litellm_backend import wire_groups  # which upstream groups take the pass-through

    upstream = [d for r in config.routes.values() if r.kind is RouteKind.UPSTREAM for d in r.model_list()]
    wire = wire_groups(upstream, config.litellm_settings)
    kinds = {RouteKind.LOCAL: "local", RouteKind.NATIVE: "native"}
    return [route_row(route, (kinds.get(route.kind) or ("pass-through" if name in wire else "LiteLLM"))
                      + (" (background)" if route.background is not None else ""))
            for name, route in sorted(config.routes.items())]


def print_rows(rows: Iterable[RouteRow], out: TextIO) -> None:
    header = ("model_name", "route", "provider", "rpm", "tpm", "max_parallel", "$/1M in / out")
    table = [header] + [(r.model_name, r.kind, r.provider, *("-" if v is None else str(v)
                                                              for v in (r.rpm, r.tpm, r.max_parallel)), r.prices)
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)


def check_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """`batchyard config check FILE`: 0 and the routes, or 2 and the error (on stderr)."""
    out = out or sys.stdout
    try:
        config = load_config(args.file, strict=args.strict_config)
        check_router(config)
        rows = route_rows(config)
        for name, path in missing_paths(config.routes):  # serve would start, and the engine fail later
            raise ConfigError(config.path, f"model_list[{name}].litellm_params.model",
                              f"local model path {path} is not a directory (a relative path is read from the "
                              "config file's directory)")
    except ConfigError as exc:
        print(f"batchyard: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{config.path}: {len(rows)} model name(s)", file=out)
    print_rows(rows, out)
    aliases = config.resolver.aliases  # router_settings.model_group_alias, resolved as LiteLLM's Router does
    hidden = hidden_aliases(config.router_settings.get("model_group_alias") or {})
    for alias, target in sorted(aliases.items()):
        print(f"alias {alias} -> {target}{' (hidden from /v1/models)' if alias in hidden else ''}", file=out)
    if config.notices:
        print(notice_text(config.notices), file=out)
    else:
        print("config: every LiteLLM setting in the file is applied", file=out)
    return EXIT_OK


__all__ = ["RouteRow", "add_parser", "check_command", "print_rows", "route_row", "route_rows"]


if __name__ == "__main__":  # `check_router_apart`'s child: the config at argv[1], its Router built
    try:
        check_router(load_config(sys.argv[1]))
    except ConfigError as error:
        print(json.dumps({"path": error.path, "key": error.key, "problem": error.problem}))
        sys.exit(EXIT_CONFIG)
