"""The code's shape, checked: no import cycle, lower layers never import higher ones, pipeline stages
import only earlier stages, no two module names that a letter or a suffix tells apart, small modules; the
backends apart from each other, no module named in a string for importlib, the native jobs reached through
their contract, one status-to-error-type table per API family.

Read statically (ast), so nothing is imported: vLLM and LiteLLM stay unloaded. Imports under
`if TYPE_CHECKING:` count as any other: an annotation that names a higher layer is an arrow back up all the
same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "providers", "local_engine")
MAX_LINES = 420  # "no product module over ~400 lines"
MAX_TEST_LINES = 600  # tests and bench: a spec reads better whole than split to fit a product rule

# The layers, lowest first. A module's layer is that of the longest prefix listed; a module may import
# its own layer and those below (lazy imports too): packages only, no module placed apart.
# `gateway.runtime.pool` knows the implementations (providers, local_engine): the composition root does;
# the intake (`pipeline.batch_service`) is pipeline work both front doors ask, composed by the runtime.
LAYERS: list[tuple[str, ...]] = [
    ("gateway", "gateway.domain", "gateway.errors", "gateway.json_codec"),
    ("gateway.config",),
    ("gateway.scheduling",),
    ("gateway.store",),
    ("gateway.metrics", "gateway.tracing"),  # metrics read the store at scrape time; the store counts nothing itself
    ("gateway.lines",),  # the rules about one line: the pipeline and the backends both apply them
    ("gateway.backends", "gateway.webhooks", "gateway.message_batches"),  # message_batches: Anthropic's words
    ("providers", "local_engine"),  # the backends the pipeline drives: they never import it
    ("providers.native",),  # providers' own batch jobs: the runner, the contract, each provider's jobs
    ("gateway.pipeline",),
    # a file's cost before it runs; what is asked after a batch's end; what is kept about the API's callers
    ("gateway.estimate", "gateway.finished", "gateway.callers"),
    ("gateway.runtime",),
    ("gateway.api",),
    ("gateway.cli",),
]
# The pipeline's stages in the order a batch meets them: a stage imports only earlier ones, even lazily.
STAGES = ["batch_params", "lifecycle", "seen_ids", "validate", "checkpoint", "shard_input", "plan", "input_files",
          "batch_service", "uploads", "message_batch_create", "merge", "output_reruns", "shard_runner",
          "finalizer", "sweeper"]


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """Every module of ours the file imports, lazily (in a function), for annotations (`TYPE_CHECKING`) or
    not: an arrow each way."""

    def walk(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    yield full if full in MODULES else child.module
            yield from walk(child)

    own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for name in walk(ast.parse(path.read_text(), str(path))):
        if name.split(".")[0] in PACKAGES:
            # importing a.b.c runs a/__init__ and a/b/__init__ too (those of the importer's own packages
            # are running already: not an edge)
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in MODULES and (prefix == name or not own.startswith(prefix + ".")):
                    yield prefix


GRAPH = {mod: set(_imports(path)) - {mod} for mod, path in MODULES.items()}


def _layer(module: str) -> int:
    best, rank = "", -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS"
    return rank


def test_there_is_no_import_cycle() -> None:
    # Tarjan's strongly connected components over every import, lazy ones included.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == [], f"import cycles: {cycles}"


def test_lower_layers_never_import_higher_ones() -> None:
    # A package whose __init__ imports nothing (a docstring) is no layer of its own.
    bare = {m for m, p in MODULES.items() if p.name == "__init__.py" and not GRAPH[m]}
    wrong = []
    for module, path in MODULES.items():
        for dep in _imports(path):  # a lazy import runs back up all the same
            if dep != module and dep not in bare and _layer(dep) > _layer(module):
                wrong.append(f"{module} (layer {_layer(module)}) imports {dep} (layer {_layer(dep)})")
    assert wrong == []


def test_a_pipeline_stage_imports_only_earlier_stages() -> None:
    assert sorted(m.split(".")[-1] for m in MODULES if m.startswith("gateway.pipeline.")) == sorted(STAGES)
    wrong = []
    for stage in STAGES:
        module = f"gateway.pipeline.{stage}"
        for dep in _imports(MODULES[module]):
            later = dep.startswith("gateway.pipeline.") and STAGES.index(dep.split(".")[-1]) > STAGES.index(stage)
            if later or dep.startswith(("gateway.api", "gateway.cli", "gateway.runtime.runtime")):
                wrong.append(f"{module} imports {dep}")
    assert wrong == []


def _confusable(a: str, b: str) -> bool:
    """Equal, one a prefix of the other (`backend`/`backends`, `run`/`run_report`), or one letter apart."""
    if a == b or a.startswith(b) or b.startswith(a):
        return True
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long_ = sorted((a, b), key=len)
    return len(long_) - len(short) == 1 and any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def test_no_two_module_names_differ_by_a_letter_or_a_suffix() -> None:
    # One name in two packages is one idea in two places (`store.sqlite.queue`, `store.redis.queue`: the same
    # interface per backend) and reads by its package; two names a letter or a suffix apart are a misreading.
    by_package: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_package.setdefault(module.rpartition(".")[0], []).append(path.stem)
    for package, stems in by_package.items():
        assert len(stems) == len(set(stems)), package
    names = sorted({stem for stems in by_package.values() for stem in stems})
    clashes = [(a, b) for a in names for b in names if a < b and _confusable(a, b)]
    assert clashes == []


def test_modules_stay_small() -> None:
    caps = [(p, MAX_LINES) for p in MODULES.values()] + [
        (p, MAX_TEST_LINES) for p in [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]]
    big = {str(p.relative_to(ROOT)): n for p, cap in caps if (n := len(p.read_text().splitlines())) > cap}
    assert big == {}


# What gateway/api may ask a store part or the blobs: these reads. Every other method of their interfaces (read
# from gateway/store/protocols.py, and the rate windows' contract it imports) is a write, so a method added to
# an interface counts as a write until it is named here.
READS = frozenset({
    "get", "page", "expired", "active",  # files, batches, backend_state
    "get_shards", "unfinished_shards", "journal", "recorded_lines", "route_stats", "logged",  # ledger
    "due", "recent", "usage", "admitted", "spend", "used",  # webhooks, quota, rates, storage
    "read", "size",  # blobs
})


def _interfaces() -> dict[str, frozenset[str]]:
    """The `Store`'s parts by the name a caller reaches them (`store.files`, …) and `blobs` -> the methods of
    each one's interface."""
    tree = ast.parse(MODULES["gateway.store.protocols"].read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for node in tree.body:  # an interface the protocols import (the rate windows': scheduling owns it)
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            imported = ast.parse(MODULES[node.module].read_text()).body
            names = {a.name for a in node.names}
            classes.update({n.name: n for n in imported if isinstance(n, ast.ClassDef) and n.name in names})

    def methods(name: str) -> frozenset[str]:
        return frozenset(f.name for f in classes[name].body
                         if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and not f.name.startswith("_"))

    parts = {f.name: ast.unparse(f.returns) for f in classes["Store"].body
             if isinstance(f, ast.FunctionDef) and f.returns is not None
             and any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)}
    return {**{part: methods(kind) for part, kind in parts.items()}, "blobs": methods("Blobs")}


INTERFACES = _interfaces()


def _named(node: ast.AST, name: str) -> bool:
    """`name` or `….name`."""
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _writes(path: Path) -> Iterator[str]:
    """Where a module may write the store or the blobs: a store part asked anything but a read
    (`….store.<part>.<method>(…)`), or handed on or kept (its taker may write it); a write method of the blobs
    called. The store as a whole and the blobs may be handed to the services below, which do the writing."""
    tree = ast.parse(path.read_text(), str(path))
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    parts = INTERFACES.keys() - {"blobs"}
    for node in ast.walk(tree):
        use = parent.get(node)
        if isinstance(node, ast.Attribute) and node.attr in parts and _named(node.value, "store"):
            if not isinstance(use, ast.Attribute) or getattr(parent.get(use), "func", None) is not use:  # not called
                yield f"line {node.lineno}: store.{node.attr} handed on"
            elif use.attr not in READS:
                yield f"line {node.lineno}: store.{node.attr}.{use.attr}()"
        elif _named(node, "blobs") and isinstance(use, ast.Attribute) and use.attr in INTERFACES["blobs"] - READS:
            yield f"line {node.lineno}: blobs.{use.attr}"


def test_the_store_interfaces_are_read_by_the_scan() -> None:
    # The write scan below is only as good as its list of interfaces: each part of the Store is one, and every
    # read named is a method of one (a read list that names nothing is no check).
    assert {"files", "batches", "ledger", "sessions", "idempotency", "rates", "blobs"} <= INTERFACES.keys()
    assert not READS - frozenset().union(*INTERFACES.values())
    assert {"open", "close"} <= INTERFACES["sessions"] - READS
    assert {"reserve", "complete", "release"} <= INTERFACES["idempotency"] - READS
    assert {"writer", "writing", "delete", "delete_prefix"} <= INTERFACES["blobs"] - READS


def test_the_http_layer_writes_no_record_and_no_blob() -> None:
    # `gateway/api` reads; every batch, file and blob write goes through the intake (`pipeline.batch_service`,
    # `pipeline.message_batch_create`) or the services after a batch's end (`gateway.finished`), and what is
    # kept about the callers (dashboard sessions, Idempotency-Keys) through `gateway.callers`.
    wrong = [f"{m} {where}" for m, p in MODULES.items() if m == "gateway.api" or m.startswith("gateway.api.")
             for where in _writes(p)]
    assert wrong == []


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    """The string constants of a module, docstrings left out (they document; an import string acts)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_gateway_names_no_provider_module_in_a_string() -> None:
    # A `providers.x:Class` string handed to importlib is an import all the same, one no arrow above shows:
    # what gateway/ needs of a provider is handed in by the composition root (gateway.runtime.pool).
    named = [f"{m} line {line}: {text!r}" for m, p in MODULES.items() if m.startswith("gateway.")
             for line, text in _strings(p) if text.startswith("providers.")]
    assert named == []


def test_the_local_engine_imports_nothing_from_providers() -> None:
    # two backends side by side: what both need (Anthropic's error words) lives below both
    wrong = [f"{m} imports {dep}" for m in MODULES if m == "local_engine" or m.startswith("local_engine.")
             for dep in GRAPH[m] if dep == "providers" or dep.startswith("providers.")]
    assert wrong == []


def test_the_native_jobs_are_reached_through_their_contract() -> None:
    # `UpstreamJobs` says every ability a provider may offer, with its default: nothing is asked of a jobs
    # class or object by name (`getattr(jobs, "min_lines")`), nor past the type checker.
    wrong = []
    for module, path in MODULES.items():
        if module != "providers.native" and not module.startswith("providers.native."):
            continue
        text = path.read_text()
        wrong += [f"{module} line {i}: an attribute past the type checker" for i, line
                  in enumerate(text.splitlines(), 1) if "type: ignore[attr-defined]" in line]
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Call) and _named(node.func, "getattr") and node.args:
                target = ast.unparse(node.args[0])
                if "jobs" in target.lower() or target in ("cls", "self"):
                    wrong.append(f"{module} line {node.lineno}: getattr({target}, ...)")
    assert wrong == []


# An Anthropic error type OpenAI's words never use: a table holding one is Anthropic's.
ANTHROPIC_ONLY = frozenset({"authentication_error", "billing_error", "not_found_error", "overloaded_error",
                            "api_error", "timeout_error"})


def test_one_status_to_error_type_table_per_api_family() -> None:
    # Two tables of one family drift apart (402, 500, 503 and 504 were in one of two Anthropic tables only):
    # each door says a status in one table's words.
    tables: dict[str, list[str]] = {"anthropic": [], "openai": []}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Dict) or not node.keys:
                continue
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, int)]
            values = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            if len(keys) != len(node.keys) or len(values) != len(node.values) or not all(400 <= k < 600 for k in keys):
                continue
            if sum(v.endswith("_error") for v in values) * 2 < len(values):
                continue  # statuses to codes (`unknown_url`), not to types
            family = "anthropic" if ANTHROPIC_ONLY & set(values) else "openai"
            tables[family].append(f"{module} line {node.lineno}")
    assert all(len(found) <= 1 for found in tables.values()), tables
    assert tables["anthropic"], "the scan finds no table: it reads nothing"
