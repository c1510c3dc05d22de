"""The ``protgpu`` command: one subcommand per domain module (see :mod:`protgpu.commands`).

Errors a user can fix (bad files, shapes, no GPU) are printed as one line on stderr with exit code 2
and no traceback; ``PROTGPU_DEBUG=1`` shows the traceback as well. ``PROTGPU_STATS_JSON=PATH`` writes
where the command's time went to PATH (see :mod:`protgpu.commands._batch_options`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .commands import COMMAND_MODULES
from .errors import ProtgpuError


def _common_parsers() -> list[argparse.ArgumentParser]:
    """Parent parsers with the options every batch subcommand shares."""
    batch = argparse.ArgumentParser(add_help=False)
    batch.add_argument("inputs", nargs="+", metavar="INPUT",
                       help="structure or trajectory files, globs, directories, @list.txt, or - for stdin")
    batch.add_argument("--out", "-o", help="output file, format by suffix (arrays: .npy, .npz; tables: .csv, .jsonl, "
                                           ".parquet); written atomically")
    batch.add_argument("--select", "-s", default=None,
                       help='atom selection, e.g. "ca", "heavy", "chain A and resid 10-50"')
    batch.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                       help="where to compute (default: auto)")
    batch.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    return [batch]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="protgpu",
        description="GPU toolkit for protein structures and MD trajectories.",
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ProtgpuError as exc:
        if os.environ.get("PROTGPU_DEBUG"):
            raise
        print(f"protgpu {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"protgpu {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if os.environ.get(STATS_ENV):
            write_stats_json(os.environ[STATS_ENV], args.command)


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
