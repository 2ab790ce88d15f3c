"""The documentation: the generated configuration reference covers the strategy registry and every
conf/ group, the API page covers ``plnexp.__all__``, every page is in the navigation, and README.md
stays a short front page with its two commands. The site itself is built with ``mkdocs build
--strict`` by .ci/run (a broken link or API reference fails that build)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

import plnexp
from plnexp.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONF = ROOT / "conf"


def _hook():
    spec = importlib.util.spec_from_file_location("plnexp_docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> str:
    return _hook().render(CONF)


def test_reference_names_every_strategy_and_its_options(reference):
    for name, entry in STRATEGIES.items():
        assert f"{{#strategy-{name}}}" in reference, f"strategy {name} has no section"
        section = reference.split(f"{{#strategy-{name}}}", 1)[1].split("\n### ", 1)[0]
        for f in fields(entry.options):
            assert f"`strategy.{f.name}`" in section, f"strategy {name}: option {f.name} missing"
            assert f.metadata["allowed"] in section


def test_reference_names_every_group_option_and_key(reference):
    files = sorted(p for p in CONF.rglob("*.yaml") if p.parent != CONF)
    assert files
    for path in files:
        group = path.parent.relative_to(CONF).as_posix()
        assert f"`{group}={path.stem}`" in reference, f"conf/{group}/{path.name} missing"
        assert path.read_text().rstrip() in reference, f"conf/{group}/{path.name}: its yaml is not shown whole"
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    for key in config:
        if key not in ("defaults", "hydra"):
            assert re.search(rf"^\| `{key}` \| ", reference, re.M), f"top-level key {key} missing"


def test_api_page_covers_the_package_exports():
    api = (DOCS / "reference" / "api.md").read_text()
    for name in plnexp.__all__:
        assert f"::: plnexp.{name}\n" in api or f"`plnexp.{name}`" in api, (
            f"plnexp.{name} is exported but not on docs/reference/api.md: add '::: plnexp.{name}'"
        )
    assert "::: plnexp.system.runtime" in (DOCS / "reference" / "runtime.md").read_text()


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_navigation():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts}
    generated = {_hook().PAGE}
    assert sorted(pages | generated) == sorted(nav)


def test_readme_is_a_short_front_page_with_the_two_commands():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) < 8192, f"README.md is {len(readme)} bytes: move detail into docs/"
    text = readme.decode()
    for command in (  # the two commands of a fresh machine, each a code block of its own
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m plnexp sweep",
        "bash .ci/run",
    ):
        assert f"```bash\n{command}\n```" in text, f"README.md lacks the command {command!r}"
    for command in ('python -m pytest -q -m "not slow"', "mkdocs serve", "mkdocs build --strict"):
        assert command in text, f"README.md lacks {command!r}"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"
