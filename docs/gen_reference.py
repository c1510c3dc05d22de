"""Generate the reference pages that must never be typed by hand: the CLI reference (from the argparse
parser ``protgpu.cli.build_parser()``), the benchmark tables (from ``benchmarks/results/*.json``) and the
index of the public API (from ``protgpu.__all__``).

Each generator returns reStructuredText. The Sphinx configuration (``docs/conf.py``) calls them from
directives while the site is built, so the pages always show the parser and the result files of the
checkout being built. Run this file to write the same text to files, e.g. to read it without Sphinx::

    python3 docs/gen_reference.py --out /tmp/protgpu-ref      # cli.rst, benchmarks.rst, api_index.rst

Only the standard library is imported at module level; ``protgpu`` is imported by the functions that
need it (the repository root is put on ``sys.path`` first, so the checkout is documented, not an
installed copy).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"

# Characters that start or end inline markup in reStructuredText (emphasis, literals, substitution and
# footnote references, targets); a backslash before any character makes it literal.
_RST_SPECIAL = re.compile(r"([\\`*_|\[\]<>])")


def _ensure_repo_on_path() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def rst_escape(text) -> str:
    r"""Text as it should appear literally in reStructuredText (table cells, paragraphs).

    Parameters
    ----------
    text : object
        Converted with ``str``; newlines become spaces.

    Returns
    -------
    str
        ``text`` with markup characters backslash-escaped, and a leading character that could start a
        list, a heading decoration or a directive (``- + # . : = ~``, or ``N.``) escaped too.

    Examples
    --------
    >>> rst_escape("|protgpu - mdtraj| max (A)")
    '\\|protgpu - mdtraj\\| max (A)'
    >>> rst_escape("- 1")
    '\\- 1'
    """
    s = " ".join(str(text).split())
    s = _RST_SPECIAL.sub(r"\\\1", s)
    if s and (s[0] in "-+#.:=~" or re.match(r"^\d+[.)]( |$)", s) or re.match(r"^[a-zA-Z][.)] ", s)):
        s = "\\" + s
    return s


def rst_literal(text) -> str:
    """``text`` as an inline literal (falls back to escaped text when it holds a backquote)."""
    s = " ".join(str(text).split())
    if not s:
        return ""
    if "`" in s:
        return rst_escape(s)
    return f"``{s}``"


def _heading(title: str, char: str) -> list[str]:
    return [title, char * max(len(title), 4), ""]


def _list_table(header: list[str], rows: list[list[str]], widths: list[int] | None = None,
                title: str | None = None) -> list[str]:
    """A ``list-table`` directive; cells are already-rendered reStructuredText."""
    out = [f".. list-table:: {title}" if title else ".. list-table::", "   :header-rows: 1"]
    if widths:
        out.append(f"   :widths: {' '.join(str(w) for w in widths)}")
    out.append("")
    for row in [header, *rows]:
        for k, cell in enumerate(row):
            bullet = "   * - " if k == 0 else "     - "
            out.append(bullet + (cell if cell else ""))
    out.append("")
    return out


# ==================================================================================================
# CLI reference


def _subparsers_action(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps no public handle on its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise ValueError("the parser has no subcommands")


def _expand_help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's ``%(default)s``-style fields filled in, as ``--help`` shows it."""
    text = action.help or ""
    if "%" not in text:
        return text
    params = dict(vars(action), prog=prog)
    for name in list(params):
        if params[name] is argparse.SUPPRESS:
            del params[name]
        elif hasattr(params[name], "__name__"):
            params[name] = params[name].__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def _option_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    takes_value = action.nargs != 0
    if not takes_value:
        return ", ".join(action.option_strings)
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.dest.upper()
    return ", ".join(f"{o} {metavar}" for o in action.option_strings)


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if not text or text[-1] in ".!?)" else text + "."


def _describe(action: argparse.Action, prog: str) -> str:
    parts = [rst_escape(_sentence(_expand_help(action, prog)))] if action.help else []
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        parts.append("Choices: " + ", ".join(rst_literal(c) for c in action.choices) + ".")
    default = action.default
    if (action.option_strings and default not in (None, False, argparse.SUPPRESS)
            and action.nargs != 0 and "default" not in (action.help or "").lower()):
        parts.append(f"Default: {rst_literal(default)}.")
    if action.required and action.option_strings:
        parts.append("Required.")
    if action.nargs in ("+", "*") and not action.option_strings:
        parts.append("One or more." if action.nargs == "+" else "Zero or more.")
    return " ".join(parts)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name, in ``--help`` order (aliases left out)."""
    action = _subparsers_action(parser)
    seen: dict[int, str] = {}
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sub in action.choices.items():
        if id(sub) in seen:
            continue
        seen[id(sub)] = name
        out[name] = sub
    return out


def cli_reference_rst(parser: argparse.ArgumentParser | None = None) -> str:
    """The CLI reference: global usage, a table of subcommands, then one section per subcommand with
    its usage line, description and every option (grouped as in ``--help``).

    Parameters
    ----------
    parser : argparse.ArgumentParser, optional
        Default: ``protgpu.cli.build_parser()``.

    Returns
    -------
    str
        reStructuredText whose sections use ``-`` underlines (one level below the page title).
    """
    if parser is None:
        _ensure_repo_on_path()
        from protgpu.cli import build_parser

        parser = build_parser()
    action = _subparsers_action(parser)
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    subs = subcommands(parser)
    out = ["Every subcommand below is listed with the options it accepts, generated from the parser",
           f"of this checkout ({len(subs)} subcommands). ``protgpu COMMAND --help`` prints the same.", "",
           ".. code-block:: text", ""]
    out += ["   " + line for line in parser.format_usage().rstrip().splitlines()]
    out.append("")
    out += _list_table(["Command", "What it does"],
                       [[f":ref:`protgpu {name} <cli-{name}>`", rst_escape(helps.get(name, ""))] for name in subs],
                       widths=[25, 75])
    for name, sub in subs.items():
        out += [f".. _cli-{name}:", ""]
        out += _heading(f"protgpu {name}", "-")
        if helps.get(name):
            out += [rst_escape(helps[name][:1].upper() + helps[name][1:]) + ".", ""]
        if sub.description:
            out += [rst_escape(sub.description), ""]
        out += [".. code-block:: text", ""]
        out += ["   " + line for line in sub.format_usage().rstrip().splitlines()]
        out.append("")
        for group in sub._action_groups:
            actions = [a for a in group._group_actions
                       if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            rows = [[rst_literal(_option_name(a)), _describe(a, sub.prog)] for a in actions]
            out += _list_table(["Argument", "Meaning"], rows, widths=[30, 70], title=rst_escape(group.title or ""))
        if sub.epilog:
            out += [rst_escape(sub.epilog), ""]
    return "\n".join(out) + "\n"


# ==================================================================================================
# Benchmark tables


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:  # NaN
            return "—"
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def _flatten(row: dict, prefix: str = "") -> dict:
    """``{"median_ms": {"protgpu": 3.3}}`` -> ``{"median_ms.protgpu": 3.3}``."""
    flat: dict = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _table_of(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    rows = [_flatten(r) for r in records]
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    body = [[rst_escape(_fmt(r.get(c))) if c in r else "" for c in columns] for r in rows]
    return [rst_escape(c) for c in columns], body


def _is_table(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def load_results(results_dir: str | Path | None = None) -> list[tuple[Path, dict]]:
    """Every ``*.json`` in ``benchmarks/results`` (sorted by name) with its parsed content.

    Raises
    ------
    ValueError
        A file that is not valid JSON or not a JSON object (a results file must never be skipped
        silently).
    """
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        out.append((path, data))
    return out


def benchmark_tables_rst(results_dir: str | Path | None = None) -> str:
    """One section per results file: the machine it ran on, its settings and every table it holds.

    Parameters
    ----------
    results_dir : path, optional
        Default: ``benchmarks/results`` of this checkout.

    Returns
    -------
    str
        reStructuredText, sections underlined with ``-`` (tables of a file with ``~``).
    """
    files = load_results(results_dir)
    if not files:
        return "No results files were found in ``benchmarks/results``.\n"
    out = [f"{len(files)} results files, read from ``benchmarks/results/`` when this page was built:", ""]
    out += [f"* :ref:`{rst_escape(p.name)} <bench-{p.stem}>`" for p, _ in files]
    out.append("")
    for path, data in files:
        out += [f".. _bench-{path.stem}:", ""]
        name = str(data.get("benchmark", path.stem.split("-")[0]))
        out += _heading(f"{name}: {path.name}", "-")
        machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
        facts = []
        for label, key in (("GPU", "gpu"), ("CPU cores", "cpu_count"), ("Python", "python"), ("date", "date")):
            value = machine.get(key, data.get(key))
            if value is not None:
                facts.append(f"{label} {rst_literal(value)}")
        commit = machine.get("commit") or data.get("git_commit") or data.get("commit")
        if commit:
            facts.append(f"commit {rst_literal(str(commit)[:10])}")
        out += [f"Source: ``benchmarks/results/{path.name}``" + ("; " + ", ".join(facts) if facts else "") + ".",
                ""]
        settings = {k: v for k, v in data.items()
                    if k not in ("machine", "benchmark") and not _is_table(v) and not isinstance(v, dict)}
        settings.update({f"{k}.{kk}": vv for k, v in data.items()
                         if k != "machine" and isinstance(v, dict) for kk, vv in _flatten(v).items()})
        if settings:
            out += _list_table(["Setting", "Value"],
                               [[rst_escape(k), rst_escape(_fmt(v))] for k, v in settings.items()], widths=[35, 65])
        for key, value in data.items():
            if not _is_table(value):
                continue
            header, body = _table_of(value)
            title = "Results" if key in ("rows", "results") else rst_escape(key)
            out += _list_table(header, body, title=title)
    return "\n".join(out) + "\n"


# ==================================================================================================
# Index of the public API


def _canonical(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


_ROLE = re.compile(r":(func|class|meth|attr|data|exc|mod|obj):`(~?)([^`<>]+)`")
_INLINE_LITERAL = re.compile(r"(``.+?``)")


def _rst_summary(text: str, module: str) -> str:
    """A docstring summary made safe for a table cell on another page: bare ``|`` escaped outside
    inline literals (absolute values), and cross-reference targets qualified with ``module`` so that
    ``:func:`contacts``` still points at ``protgpu.contacts.contacts``."""
    parts = _INLINE_LITERAL.split(text)
    text = "".join(p if k % 2 else p.replace("|", r"\|") for k, p in enumerate(parts))

    import importlib

    mod = importlib.import_module(module)

    def qualify(m: re.Match) -> str:
        role, _tilde, target = m.groups()
        if "." in target or role == "mod":
            return m.group(0)
        obj = getattr(mod, target, None)
        home = getattr(obj, "__module__", None) or module  # imported names point at their own module
        return f":{role}:`{target} <{home}.{target}>`"

    return _ROLE.sub(qualify, text)


def api_index_rst() -> str:
    """A table of every name in ``protgpu.__all__`` with its one-line summary and a link to its entry
    in the module pages (where it is documented once, under the module that defines it).

    Returns
    -------
    str
        reStructuredText: one ``list-table``.
    """
    _ensure_repo_on_path()
    import inspect

    import protgpu

    rows = []
    for name in sorted(protgpu.__all__, key=str.lower):
        obj = getattr(protgpu, name)
        if inspect.isclass(obj):
            role = "exc" if issubclass(obj, BaseException) else "class"
        elif callable(obj):
            role = "func"
        else:
            rows.append([f"``pg.{name}``", rst_escape(repr(obj))])
            continue
        doc = inspect.getdoc(obj) or ""
        # The summary is the docstring's first paragraph, kept as reStructuredText (autodoc parses the
        # same text on the module pages); roles in it resolve against the defining module.
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        summary = _rst_summary(summary, obj.__module__)
        rows.append([f":py:{role}:`pg.{name} <{_canonical(obj)}>`", summary])
    return "\n".join(_list_table(["Name", "Summary"], rows, widths=[30, 70])) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for cli.rst, benchmarks.rst and api_index.rst")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="benchmark results folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cli.rst").write_text(cli_reference_rst())
    (out / "benchmarks.rst").write_text(benchmark_tables_rst(args.results))
    (out / "api_index.rst").write_text(api_index_rst())
    print(f"wrote cli.rst, benchmarks.rst, api_index.rst to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
