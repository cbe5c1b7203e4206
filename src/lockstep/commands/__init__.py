"""One module per `lockstep` subcommand. Each has `add_parser(subparsers)` and `run(args) -> int`."""

# Order is the order `lockstep --help` lists them in.
COMMAND_MODULES = ["run", "prepare", "init_checkpoint", "convert", "inspect", "compare", "report", "history", "golden",
                   "diagnose", "bisect"]
