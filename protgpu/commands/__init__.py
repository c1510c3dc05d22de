"""One module per ``protgpu`` subcommand. Each defines ``register(subparsers, common)``, which adds
its parser (``common`` are the parent parsers holding the shared batch options) and sets
``func=run`` where ``run(args) -> int`` is the exit code."""

# Order is the order of ``protgpu --help``.
COMMAND_MODULES = ["info", "kernels", "distances", "contacts", "rmsd", "score", "cluster", "evaluate",
                   "align", "search", "db"]
