"""What the ``protgpu`` subcommands say: their ``--help`` (description, examples, ``--out`` formats),
suggestions for a mistyped word, and the translation of the library's messages into the CLI's words.

The library's messages name Python parameters (``pass top=``, ``fit='chain Z'``, ``device='gpu'``);
on the command line the same thing is an option (``--top``, ``--fit 'chain Z'``, ``--device gpu``):
:func:`cli_words` rewrites one into the other where the CLI shows a message, so the domain code keeps
the words of its own API. It also puts the destination back where a message names the temporary file
an output is being written to (``.m.npz.ab12cd34.tmp.npz``, :func:`protgpu.io.atomic_path`).
"""

from __future__ import annotations

import argparse
import difflib
import re


def examples(*pairs: tuple[str, str]) -> str:
    """An ``--help`` epilog: ``examples:`` then each command line with what it does under it."""
    lines = ["examples:"]
    for command, what in pairs:
        lines += [f"  {command}", f"      {what}"]
    return "\n".join(lines)


def add_parser(sub, name: str, *, help: str, description: str, example: list[tuple[str, str]], parents=()):
    """A subcommand's parser with its one-line ``help``, a ``description`` and examples in its epilog
    (laid out as written: RawDescriptionHelpFormatter)."""
    return sub.add_parser(name, parents=list(parents), help=help, description=description,
                          epilog=examples(*example), formatter_class=argparse.RawDescriptionHelpFormatter)


def add_out(p, formats: str) -> None:
    """``--out/-o`` with the formats this subcommand writes (``formats``: the rest of the help text)."""
    p.add_argument("--out", "-o", metavar="FILE", help=f"output file, format by suffix: {formats}; written atomically")


def did_you_mean(word: str, choices) -> str:
    """``" (did you mean X?)"`` for the closest of ``choices`` to ``word``, else ``""``."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# The library's words -> the CLI's, per subcommand where the same parameter is another option there
# (``atoms=`` is rmsd's --select but score's --lddt-atoms). Each pattern matches the parameter as a
# message shows it: ``name=VALUE`` or ``name must``.
_VALUE = r"('[^']*'|\"[^\"]*\"|\S+)"
_COMMON = [
    (re.compile(r"\bpass top=(?=\s|$|\))"), "pass --top"),
    (re.compile(r"\btop=(?=\s|$|\))"), "--top"),
    (re.compile(r"\bdevice='(\w+)'"), r"--device \1"),
    (re.compile(r"\bdevices="), "--gpus"),
    (re.compile(r"\bselect=" + _VALUE), r"--select \1"),
    (re.compile(r"\bresidues=" + _VALUE), r"--select \1"),
    (re.compile(r"\bfit=" + _VALUE), r"--fit \1"),
    (re.compile(r"^models: "), ""),
]
_OPTION_NAMES = ("cutoff", "min_separation", "scheme", "precision", "temperature", "normalize_by", "mapping")
_PER_COMMAND = {
    "rmsd": [(re.compile(r"\batoms=" + _VALUE), r"--select \1")],
    "score": [(re.compile(r"\batoms=" + _VALUE), r"--lddt-atoms \1"),
              (re.compile(r"\batoms must\b"), "--lddt-atoms must")],
}
# An atomic_path temporary: .NAME.<8 characters>.tmp[.SUFFIX] or .NAME.<8>.old.tmp, NAME the destination.
_TEMP = re.compile(r"(?P<dir>[^\s'\"(=]*/)?\.(?P<name>[^\s/'\"]+?)\.[0-9a-z_]{8}\.(?:old\.)?tmp(?:\.[A-Za-z0-9]+)?\b")


def cli_words(message: str, command: str | None = None) -> str:
    """``message`` (from the library) in the words of ``protgpu COMMAND``: options for parameters, and
    the destination for a temporary output file's name.

    Parameters
    ----------
    message : str
        An error message.
    command : str, optional
        The subcommand showing it (some parameters are different options in different subcommands).

    Returns
    -------
    str
        The message with ``top=`` as ``--top``, ``fit='x'`` as ``--fit 'x'``, ``cutoff must`` as
        ``--cutoff must`` and so on, and ``DIR/.NAME.ab12cd34.tmp.SUFFIX`` as ``DIR/NAME``.

    Examples
    --------
    >>> cli_words("x.dcd: a .dcd trajectory holds no topology; pass top= (a PDB/mmCIF file)")
    'x.dcd: a .dcd trajectory holds no topology; pass --top (a PDB/mmCIF file)'
    >>> cli_words("cannot save /tmp/.out.pdb.0clgd5zm.tmp.pdb (no space)")
    'cannot save /tmp/out.pdb (no space)'
    """
    text = _TEMP.sub(lambda m: f"{m.group('dir') or ''}{m.group('name')}", message)
    for pattern, repl in _COMMON + _PER_COMMAND.get(command or "", []):
        text = pattern.sub(repl, text)
    names = "|".join(_OPTION_NAMES)
    return re.sub(rf"(?<![-\w])({names}) must\b", lambda m: f"--{m.group(1).replace('_', '-')} must", text)


def translate_failures(summary, command: str):
    """``summary`` with its failed inputs' reasons in the CLI's words (:func:`cli_words`)."""
    from dataclasses import replace

    if not summary.failed:
        return summary
    return replace(summary, failed=[(path, cli_words(str(why), command)) for path, why in summary.failed])
