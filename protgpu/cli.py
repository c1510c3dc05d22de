"""The ``protgpu`` command: one subcommand per domain module (see :mod:`protgpu.commands`).

Errors a user can fix (bad files, shapes, no GPU) are printed as one line on stderr with exit code 2
and no traceback; ``PROTGPU_DEBUG=1`` shows the traceback as well.
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


if __name__ == "__main__":
    sys.exit(main())
