"""The ``protgpu`` command: one subcommand per domain module (see :mod:`protgpu.commands`).

Errors a user can fix (bad files, shapes, no GPU) are printed as one line on stderr with exit code 2
and no traceback, in the command line's words (:func:`protgpu.commands._cli_text.cli_words`);
``PROTGPU_DEBUG=1`` shows the traceback as well. A mistyped command line is one line too, with the
closest option or subcommand suggested; options must be spelled out (no prefixes: ``--cutof 5`` is
an error, not ``--cutoff 5``). ``protgpu`` alone prints the help and exits 2 (nothing was run), as
does a batch subcommand given nothing else (``protgpu rmsd``). ``PROTGPU_STATS_JSON=PATH`` writes
where the command's time went to PATH (see :mod:`protgpu.commands._batch_options`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from . import __version__
from .commands import COMMAND_MODULES
from .commands._cli_text import cli_words, did_you_mean
from .errors import ProtgpuError


class _Parser(argparse.ArgumentParser):
    """argparse with whole option names only and one-line errors that suggest the closest word.

    argparse's own error is the usage and the message on two lines; here it is one line naming
    ``--help``, with ``(did you mean --cutoff?)`` for a mistyped option, subcommand or choice.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # "--cutof 5" must not quietly mean --cutoff
        super().__init__(*args, **kwargs)

    def option_names(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]

    def error(self, message: str):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        elif message.startswith("unrecognized arguments: "):
            words = [w.split("=", 1)[0] for w in message.split(": ", 1)[1].split() if w.startswith("--")]
            hints = [did_you_mean(w, self.option_names()) for w in words]
            message += next((h for h in hints if h), "")
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _common_parsers() -> list[argparse.ArgumentParser]:
    """Parent parsers with the options every batch subcommand shares (each adds its own ``--out``,
    whose help lists the formats it writes)."""
    batch = argparse.ArgumentParser(add_help=False)
    batch.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="structure or trajectory files, globs, directories, @list.txt, or - for stdin")
    batch.add_argument("--select", "-s", default=None,
                       help='atom selection, e.g. "ca", "heavy", "chain A and resid 10-50"')
    batch.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                       help="where to compute (default: auto)")
    batch.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    return [batch]


def build_parser() -> argparse.ArgumentParser:
    """The ``protgpu`` parser: one subparser per module of :data:`protgpu.commands.COMMAND_MODULES`."""
    parser = _Parser(
        prog="protgpu",
        description="GPU toolkit for protein structures and MD trajectories.",
        epilog="run 'protgpu COMMAND --help' for a command's options and examples",
    )
    parser.add_argument("--version", action="version", version=f"protgpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = _common_parsers()
    for name in COMMAND_MODULES:
        importlib.import_module(f".commands.{name}", __package__).register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .commands._batch_options import STATS_ENV, begin, write_stats_json

    begin()  # stamps the start of the command, the imports done
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # no public handle
    if not argv or (len(argv) == 1 and _needs_inputs(subs.choices.get(argv[0]))):
        # Nothing to run: the help says what could be, and exit 2 tells a script that nothing ran.
        (subs.choices[argv[0]] if argv else parser).print_help()
        return 2
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's parser knows its options: it suggests the closest one
        subs.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except ProtgpuError as exc:
        if os.environ.get("PROTGPU_DEBUG"):
            raise
        print(f"protgpu {args.command}: error: {cli_words(str(exc), args.command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"protgpu {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if os.environ.get(STATS_ENV):
            write_stats_json(os.environ[STATS_ENV], args.command)


def _needs_inputs(sub) -> bool:
    """Whether a subparser takes input files (a batch subcommand)."""
    return sub is not None and any(a.dest == "inputs" for a in sub._actions)


def _can_skip_teardown() -> bool:
    """Whether the process may end without the interpreter's teardown: nothing else is running (no
    other live non-daemon thread, no child process), coverage.py is not measuring this process (it saves
    its data at exit), and ``PROTGPU_FAST_EXIT`` is not 0."""
    if os.environ.get("PROTGPU_FAST_EXIT", "1").strip() == "0" or "coverage" in sys.modules:
        return False
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return False
    mp = sys.modules.get("multiprocessing")
    return mp is None or not mp.active_children()


def console_main() -> None:
    """The ``protgpu`` command: :func:`main`, then the end of the process.

    Once the command is done (outputs written and closed, worker processes joined) the process ends
    with ``os._exit`` after flushing stdout and stderr: the interpreter's teardown (freeing every
    module, the exit handlers of CuPy and multiprocessing) costs 0.1-0.5 s and does nothing a finished
    command needs. It runs as usual when :func:`_can_skip_teardown` says so.
    """
    rc = main()
    if _can_skip_teardown():
        import logging

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        logging.shutdown()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    console_main()
