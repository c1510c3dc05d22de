"""Sphinx configuration of the protgpu documentation.

Build (warnings are errors, as in CI)::

    python3 -m sphinx -W --keep-going -b html docs /tmp/protgpu-docs

Sphinx with autodoc + napoleon reads the numpydoc docstrings of the checkout (the repository root is
put first on ``sys.path``, so no install is needed). Three directives defined below insert pages that
are generated while the site is built, never typed by hand: the CLI reference (from
``protgpu.cli.build_parser()``), the benchmark tables (from ``benchmarks/results/*.json``, or the
folder in ``$PROTGPU_BENCHMARK_RESULTS``) and the index of ``protgpu.__all__``. Nothing is written into
the source tree.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402  (needs the path above)

import protgpu  # noqa: E402

project = "protgpu"
author = "protgpu developers"
copyright = "protgpu developers"
version = release = protgpu.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
templates_path: list[str] = []
html_theme = "alabaster"
html_static_path = ["_static"]
html_title = f"protgpu {release}"
html_theme_options = {"description": "GPU toolkit for protein structures and MD trajectories",
                      "fixed_sidebar": True}

# numpydoc-style docstrings through napoleon (part of Sphinx: nothing else to install). "Attributes"
# sections become :ivar: fields, not attribute entries, so that a NamedTuple's fields (which autodoc
# documents too) are not described twice.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"  # the docstrings state types, shapes and units; signatures keep defaults
autodoc_inherit_docstrings = False
autoclass_content = "class"
add_module_names = False
smartquotes = False  # keep "--option" and quotes as typed (no en dashes in option names)


def _results_dir() -> Path:
    env = os.environ.get("PROTGPU_BENCHMARK_RESULTS")
    return Path(env) if env else REPO / "benchmarks" / "results"


_INLINE_LITERAL = re.compile(r"(``.+?``)")
_BLOCK_LINE = re.compile(r"^\s*(\|(\s|$)|\+[-=+])")


def _escape_bars(app, what, name, obj, options, lines) -> None:
    """Docstrings write absolute values and norms as plain text (``|x_i - x_j|``, ``|d_model - d_ref|``);
    reStructuredText would read ``|...|`` as a substitution reference and fail the build. protgpu uses
    no substitutions, so bars outside inline literals are escaped (line blocks and grid tables, whose
    lines start with ``"| "`` or ``"+-"``, are left alone)."""
    for i, line in enumerate(lines):
        if "|" not in line or _BLOCK_LINE.match(line):
            continue
        parts = _INLINE_LITERAL.split(line)
        lines[i] = "".join(p if k % 2 else p.replace("|", r"\|") for k, p in enumerate(parts))


def setup(app):
    from sphinx.util.docutils import SphinxDirective
    from sphinx.util.parsing import nested_parse_to_nodes

    class _Generated(SphinxDirective):
        """Parse generated reStructuredText in place (its sections nest under the current one)."""

        has_content = False

        def text(self) -> str:
            raise NotImplementedError

        def run(self):
            return nested_parse_to_nodes(self.state, self.text(), source=f"<{self.name}>")

    class CLIReference(_Generated):
        def text(self) -> str:
            for path in [REPO / "protgpu" / "cli.py", *sorted((REPO / "protgpu" / "commands").glob("*.py"))]:
                self.env.note_dependency(str(path))  # rebuild the page when a subcommand changes
            return gen_reference.cli_reference_rst()

    class BenchmarkTables(_Generated):
        def text(self) -> str:
            folder = _results_dir()
            for path in sorted(folder.glob("*.json")):
                self.env.note_dependency(str(path))
            return gen_reference.benchmark_tables_rst(folder)

    class APIIndex(_Generated):
        def text(self) -> str:
            return gen_reference.api_index_rst()

    app.connect("autodoc-process-docstring", _escape_bars)
    app.add_directive("protgpu-cli-reference", CLIReference)
    app.add_directive("protgpu-benchmark-tables", BenchmarkTables)
    app.add_directive("protgpu-api-index", APIIndex)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
