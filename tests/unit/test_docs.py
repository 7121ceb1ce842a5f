"""The docs stay true to the code: every config setting is described, the generated reference pages
(configuration, CLI) match the code, every package has its line in "How the code is laid out", every
page is in the navigation, and the README stays a short front page whose links resolve.

`mkdocs build --strict` (scripts/test.sh) checks the links and anchors inside docs/; this needs no mkdocs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from scripts.docs_reference import config_models, main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MODELS = config_models()


@pytest.mark.parametrize(("path", "model"), MODELS, ids=[m.__name__ for _, m in MODELS])
def test_every_config_model_and_field_is_described(path: str, model: type) -> None:
    assert (model.__doc__ or "").strip(), f"{model.__name__} ({path or 'the file'}) has no docstring"
    undescribed = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not undescribed, (f"{model.__name__}: no docstring under {undescribed}: it is the setting's description "
                             "in the docs' configuration reference")


def test_the_reference_reaches_every_section() -> None:
    paths = {path for path, _ in MODELS}
    assert {"", "model_list[]", "batch_settings", "batch_settings.teams[]", "batch_settings.webhooks",
            "batch_settings.metrics", "general_settings", "model_list[].litellm_params"} <= paths


def test_generated_pages_match_the_code() -> None:
    assert main(["--check"]) == 0, "run: python scripts/docs_reference.py"


def _packages() -> set[str]:
    return {str(p.parent.relative_to(ROOT)) for pkg in ("gateway", "providers", "local_engine")
            for p in (ROOT / pkg).rglob("__init__.py")}


def test_layout_page_has_one_line_per_package() -> None:
    rows = re.findall(r"^\| `([^`]+)/`", (DOCS / "layout.md").read_text(), re.M)
    assert len(rows) == len(set(rows)), "a package is listed twice"
    assert not _packages() - set(rows), f"packages missing from docs/layout.md: {sorted(_packages() - set(rows))}"
    assert not set(rows) - _packages(), f"docs/layout.md lists what is no package: {sorted(set(rows) - _packages())}"


def _nav_pages(items: list) -> set[str]:
    pages = set()
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # no mkdocs tags in it
    nav = _nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav == pages, f"not in mkdocs.yml's nav: {sorted(pages - nav)}; no such page: {sorted(nav - pages)}"


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert f"\n{command}" in text, f"the quickstart command {command!r} is gone"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links into the docs"
    dead = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not dead, f"README links to missing files: {dead}"
