"""The documentation: the README is a front page linking into the docs site, every page of
docs/ is in the site's navigation, every relative link resolves, and the Griffe extension of
the API reference turns the docstrings' reST markup into Markdown. The site build itself
(`mkdocs build --strict`, which also checks anchors and cross-references) runs in .ci/run;
the examples of the pages run in tests/test_readme.py, test_recipes.py, test_metrics_docs.py.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# [text](target), not an image; the target has no spaces
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_the_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    # quick start: exactly the two commands, one runs the bench, one the tests
    assert bash[:2] == ["pip install -e . && cogcal bench\n", 'pip install -e ".[dev]" && pytest\n']
    assert '`pytest -m "not slow"`' in text and "the full suite above is what CI" in text
    assert 'pip install -e ".[docs]" && mkdocs serve' in text
    for heading in (
        "## Quick start",
        "## Calibrate your model",
        "## Your data",
        "## What the main job shows",
        "## Documentation",
    ):
        assert f"\n{heading}\n" in text, heading
    linked = {target.split("#")[0] for target in LINK.findall(_prose(text))}
    nav = _nav_pages()
    # the user guide, the bench and the API reference are linked from the front page
    assert {f"docs/{page}" for page in nav if "/" not in page} <= linked
    assert "docs/api/index.md" in linked


def test_ci_runs_the_readme_test_command_then_builds_the_docs():
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tests = commands.index('pip install -e ".[dev]" && pytest')  # the README's, exactly
    readme = README.read_text(encoding="utf-8")
    assert '```bash\npip install -e ".[dev]" && pytest\n```' in readme
    docs = commands.index('pip install -e ".[docs]"')
    assert tests < docs < commands.index("mkdocs build --strict")
    assert docs < commands.index("pytest tests/test_docs.py")  # the extension's tests run


def _nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    pages: list[str] = []

    def walk(item: object) -> None:
        if isinstance(item, str):
            pages.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)

    walk(config["nav"])
    return pages


def test_every_page_is_in_the_navigation_once():
    nav = _nav_pages()
    assert len(nav) == len(set(nav))
    on_disk = {
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if not p.relative_to(DOCS).as_posix().startswith("_")
    }
    assert set(nav) == on_disk


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Links work on GitHub and on the site: each names an existing file, and a page of the
    site links only to files of the site (sources and scripts are named, not linked)."""
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the same page (checked by mkdocs --strict)
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_file(), f"{page.name}: {target}"
        if page != README:
            assert DOCS in path.parents, f"{page.name}: {target} is outside docs/"


def test_the_main_job_page_includes_the_measured_results_from_the_readme():
    readme = README.read_text(encoding="utf-8")
    start, end = "<!-- --8<-- [start:measured] -->", "<!-- --8<-- [end:measured] -->"
    assert readme.count(start) == readme.count(end) == 1
    measured = readme[readme.index(start) : readme.index(end)]
    section = readme[readme.index("## What the main job shows") : readme.index("## Documentation")]
    assert measured in section and re.search(r"^\| [\w-]+ \| Acc ↑ \|", measured, re.M)
    assert "**What the verdict is now.**" in measured and re.search(r"\d+ min \d+ s", measured)
    page = (DOCS / "main-job.md").read_text(encoding="utf-8")
    assert '--8<-- "README.md:measured"' in page


# --------------------------------------------------------------- the Griffe extension


def _extension():
    griffe = pytest.importorskip("griffe")  # the `docs` extra (.ci/run installs it, reruns us)
    spec = importlib.util.spec_from_file_location("rst_markup", DOCS / "_ext" / "rst_markup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return griffe, module


CODE = '''
class A:
    """Uses B."""

    def g(self):
        """Calls f."""


class B:
    def f(self):
        """F."""
'''


def test_roles_become_optional_cross_references_resolved_in_scope():
    griffe, ext = _extension()
    text = ":class:`B`, :meth:`~B.f`, :meth:`g`, :func:`cogcal.fit` and :data:`nowhere`."
    with griffe.temporary_visited_module(CODE, module_name="m") as module:
        out = ext.convert(text, module["A"].members["g"])
    assert '<code><autoref identifier="m.B" optional>B</autoref></code>' in out
    assert '<autoref identifier="m.B.f" optional>f</autoref>' in out  # ~: the last name
    assert '<autoref identifier="m.A.g" optional>g</autoref>' in out  # a sibling method
    assert '<autoref identifier="cogcal.fit" optional>cogcal.fit</autoref>' in out  # dotted
    assert "and `nowhere`." in out  # not a name in scope: plain code, no reference
    assert ":class:" not in out and ":meth:" not in out


def test_math_and_literal_blocks_become_markdown():
    _, ext = _extension()
    text = (
        "Minimises\n\n"
        ".. math::\n\n"
        "    J = \\frac{1}{n}\n"
        "        + x\n\n"
        "with :math:`\\theta` and :math:` T_0 `.\n\n"
        "    Layout of a folder::\n\n"
        "        out/\n"
        "          a.json\n\n"
        "    End.\n"
        "Keep ``a::b`` and ``x``."
    )
    out = ext.convert(text)
    assert "Minimises\n\n$$\nJ = \\frac{1}{n}\n    + x\n$$\n" in out
    assert "with $\\theta$ and $T_0$." in out
    assert "    Layout of a folder:\n\n    ```text\n    out/\n      a.json\n    ```\n" in out
    assert out.endswith("\n    End.\nKeep ``a::b`` and ``x``.")
    assert ext.convert("Nothing follows::\n") == "Nothing follows::\n"  # not a block


def test_a_docstring_built_by_an_expression_is_documented():
    griffe, ext = _extension()
    module = griffe.load("cogcal.calibrators", search_paths=[ROOT / "src"])
    assert module["VectorScaling"].docstring is None  # `__doc__ = (... + ...)`: not static
    ext._walk(module, module.docstring)
    doc = module["VectorScaling"].docstring.value
    assert doc.startswith("Vector scaling: ``w * z + b``") and "Parameters\n----------" in doc
    assert "$$" in doc and ":class:" not in doc
