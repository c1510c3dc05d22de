"""Documentation: doctests of every public module, the list of public functions still without an
Examples section, the Sphinx site built with warnings as errors, the generated reference pages, the
quick start's code and the README figure.

The site build needs Sphinx (the ``docs`` extra) and is skipped cleanly without it.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import protgpu

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"


def _load_docs_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_protgpu_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_reference = _load_docs_module("gen_reference")


def public_modules() -> list[str]:
    """``protgpu`` and every submodule with no underscore-prefixed part in its name."""
    names = ["protgpu"]
    for info in pkgutil.walk_packages(protgpu.__path__, "protgpu."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return sorted(names)


def _module(name: str):
    # importlib, not attribute access: ``protgpu.scoring.lddt`` the attribute is the function.
    return importlib.import_module(name)


# --------------------------------------------------------------------------------------------------
# Doctests


@pytest.mark.parametrize("name", public_modules())
def test_doctests(name):
    module = _module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name) if t.examples]
    if not tests:
        return  # nothing to run; missing Examples are listed by test_public_functions_have_examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    cwd = os.getcwd()
    try:
        os.chdir(REPO)  # examples may name files under datasets/
        for test in tests:
            runner.run(test, out=report.append)
    finally:
        os.chdir(cwd)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)


def test_docs_helper_doctests():
    result = doctest.testmod(gen_reference, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# --------------------------------------------------------------------------------------------------
# Which public functions still lack an Examples section


def public_functions() -> dict[str, object]:
    """The functions a user calls: functions (and classes' public methods) named in ``protgpu.__all__``,
    and functions named in each public module's ``__all__``, by their defining module's name."""
    found: dict[str, object] = {}

    def add(obj) -> None:
        key = f"{obj.__module__}.{obj.__qualname__}"
        found.setdefault(key, obj)

    for name in protgpu.__all__:
        obj = getattr(protgpu, name)
        if inspect.isfunction(obj):
            add(obj)
        elif inspect.isclass(obj) and not issubclass(obj, BaseException) and obj.__module__.startswith("protgpu"):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if inspect.isfunction(func):
                    add(func)
    for mod_name in public_modules():
        module = _module(mod_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isfunction(obj) and obj.__module__.startswith("protgpu"):
                add(obj)
    return dict(sorted(found.items()))


def _has_examples(obj) -> bool:
    doc = inspect.getdoc(obj) or ""
    return bool(re.search(r"^Examples\n-{8,}\n", doc, flags=re.M)) and ">>>" in doc


def test_public_functions_have_docstrings():
    missing = [name for name, obj in public_functions().items() if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, f"public functions without a docstring: {missing}"


def test_public_functions_have_examples():
    """Every public function has an Examples section with at least one ``>>>`` line (which
    test_doctests runs). A helper that users never call belongs out of its module's ``__all__``
    (it stays importable by name) rather than here with a token example."""
    functions = public_functions()
    missing = [name.removeprefix("protgpu.") for name, obj in functions.items() if not _has_examples(obj)]
    assert not missing, (f"{len(missing)} of {len(functions)} public functions lack an Examples section: "
                         + ", ".join(missing))


def test_public_function_examples_are_found_by_doctest():
    """Each public function's examples are collected by test_doctests (an Examples section in a
    docstring doctest does not see, e.g. of a function not reachable from its module, would never run)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    collected: set[str] = set()
    for mod_name in public_modules():
        collected |= {t.name for t in finder.find(_module(mod_name), mod_name) if t.examples}
    not_run = [key for key in public_functions() if key not in collected]
    assert not not_run, f"examples that test_doctests does not run: {not_run}"


# --------------------------------------------------------------------------------------------------
# Generated reference pages (no Sphinx needed)


def _subcommands():
    from protgpu.cli import build_parser

    parser = build_parser()
    return parser, gen_reference.subcommands(parser)


def test_cli_reference_lists_every_subcommand_and_option():
    import argparse

    parser, subs = _subcommands()
    text = gen_reference.cli_reference_rst(parser)
    assert subs, "the parser has no subcommands"
    for name, sub in subs.items():
        assert f"\nprotgpu {name}\n" in text, f"no section for protgpu {name}"
        assert f"usage: protgpu {name}" in text
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for opt in action.option_strings:
                assert opt in text, f"protgpu {name}: {opt} missing from the CLI reference"


def _fake_results(folder: Path) -> dict[str, str]:
    """Results files with the awkward content real ones may have; returns {file: a value in it}."""
    import json

    folder.mkdir()
    files = {
        "weird-cpu.json": {
            "benchmark": "weird",
            "machine": {"gpu": None, "cpu_count": 2, "date": "2026-01-01", "commit": "abc"},
            "rows": [{"impl": "|protgpu - mdtraj| max (A)", "seconds": 1.5e-6, "note": "*bold* `tick` _x_ [1]_"},
                     {"impl": "- looks like a list", "seconds": None, "nested": {"a": 1, "b": [1, 2]}},
                     {"impl": "2.", "ratio": float("nan"), "ok": True}],
            "sweep": [{"k": 1}, {"k": 2, "extra": "x"}],
            "problem": {"L": 4096, "dtype": "bfloat16"},
            "quick": False,
        },
        "io-cpu.json": {"benchmark": "io", "results": [{"file": "a.pdb", "median_ms": {"protgpu": 3.3, "mdtraj": 58}}]},
        "empty-gpu.json": {"benchmark": "empty", "rows": []},
    }
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return {"weird-cpu.json": "|protgpu - mdtraj| max (A)", "io-cpu.json": "median_ms.mdtraj",
            "empty-gpu.json": "empty"}


def _docutils_problems(text: str) -> list[str]:
    """Problems docutils reports in ``text``, leaving out Sphinx's roles that plain docutils lacks."""
    docutils_core = pytest.importorskip("docutils.core")
    from docutils import nodes

    tree = docutils_core.publish_doctree(text, settings_overrides={"report_level": 5, "halt_level": 5,
                                                                    "warning_stream": False})
    problems = []
    for msg in tree.findall(nodes.system_message):
        body = msg.astext()
        if msg["level"] >= 2 and '"ref"' not in body:  # Sphinx's :ref: role
            problems.append(body)
    # Some problems (an undefined |substitution|) leave only a "problematic" node behind.
    problems += [p.astext() for p in tree.findall(nodes.problematic) if not p.astext().startswith(":ref:")]
    return problems


def test_benchmark_tables_escape_and_cover_every_file(tmp_path):
    expected = _fake_results(tmp_path / "results")
    text = gen_reference.benchmark_tables_rst(tmp_path / "results")
    for name in expected:
        assert f"benchmarks/results/{name}" in text
    assert not _docutils_problems(text)
    docutils_core = pytest.importorskip("docutils.core")
    rendered = docutils_core.publish_doctree(text, settings_overrides={"report_level": 5}).astext()
    for value in expected.values():
        assert value in rendered, f"{value!r} is not shown as written"
    assert "*bold* `tick` _x_ [1]_" in rendered
    assert "- looks like a list" in rendered


def test_benchmark_tables_refuse_a_broken_file(tmp_path):
    (tmp_path / "bad-gpu.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad-gpu.json"):
        gen_reference.benchmark_tables_rst(tmp_path)


def test_benchmark_tables_of_the_repository_cover_every_results_file():
    text = gen_reference.benchmark_tables_rst(RESULTS)
    files = sorted(RESULTS.glob("*.json"))
    assert files, "benchmarks/results has no results"
    for path in files:
        assert f"benchmarks/results/{path.name}" in text
    assert not _docutils_problems(text)


def test_api_index_lists_all_public_names():
    text = gen_reference.api_index_rst()
    for name in protgpu.__all__:
        assert f"pg.{name}" in text


# --------------------------------------------------------------------------------------------------
# The Sphinx site


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the docs toolchain (pip install -e '.[docs]') is not installed")
    out = tmp_path_factory.mktemp("docs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("PROTGPU_BENCHMARK_RESULTS", None)
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", "-d", str(out / "doctrees"),
           str(DOCS), str(out / "html")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, f"sphinx -W failed:\n{res.stdout}\n{res.stderr}"
    return out / "html"


def _page_text(path: Path) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))


def test_site_builds_with_warnings_as_errors(built_site):
    for page in ("index", "install", "quickstart", "concepts", "notebooks", "features", "cli", "benchmarks",
                 "api/index"):
        assert (built_site / f"{page}.html").is_file(), page
    assert (built_site / "_images" / "adk_contact_map.png").is_file() or \
        (built_site / "_static" / "adk_contact_map.png").is_file()


def test_site_cli_page_has_every_subcommand(built_site):
    _, subs = _subcommands()
    text = _page_text(built_site / "cli.html")
    for name in subs:
        assert f"protgpu {name}" in text
        assert f"usage: protgpu {name}" in text


def test_site_benchmark_page_has_every_results_file(built_site):
    text = _page_text(built_site / "benchmarks.html")
    for path in sorted(RESULTS.glob("*.json")):
        assert path.name in text


def test_site_api_pages_document_the_public_functions(built_site):
    pages = " ".join(p.read_text() for p in (built_site / "api").glob("*.html"))
    for name in protgpu.__all__:
        obj = getattr(protgpu, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            anchor = f'id="{obj.__module__}.{obj.__qualname__}"'
            assert anchor in pages, f"pg.{name} is not documented ({anchor})"


# --------------------------------------------------------------------------------------------------
# Pages whose content must stay true


def test_quickstart_code_runs(monkeypatch):
    """Every ``python`` block of the quick start, run in order from the repository root."""
    text = (DOCS / "quickstart.rst").read_text()
    blocks = re.findall(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", text, flags=re.M)
    assert len(blocks) >= 4
    code = "\n".join("\n".join(line[3:] for line in block.splitlines()) for block in blocks)
    monkeypatch.chdir(REPO)
    exec(compile(code, str(DOCS / "quickstart.rst"), "exec"), {"__name__": "__quickstart__"})


def test_feature_table_names_every_tool():
    text = (DOCS / "features.rst").read_text()
    for tool in ("MDTraj", "MDAnalysis", "Biotite", "Biopython", "US-align", "OpenStructure"):
        assert f"     - {tool}\n" in text, tool


def test_readme_figure_is_committed_and_small():
    png = DOCS / "_static" / "adk_contact_map.png"
    assert png.is_file(), "run python3 docs/make_figures.py"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) < 200 * 1024


def test_make_figures_draws_the_contact_map(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    make_figures = _load_docs_module("make_figures")
    assert make_figures.main(["--out", str(tmp_path), "--device", "cpu"]) == 0
    img = imread(tmp_path / "adk_contact_map.png")
    assert img.shape[0] > 300 and img[..., :3].std() > 0.1
