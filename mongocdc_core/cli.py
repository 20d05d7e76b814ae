"""The ``mongocdc`` command: one entry point whose subcommands live with the code they run.

Each subcommand module parses its own arguments (``main(argv) -> int``), so this file only routes
and stays free of heavy imports: ``mongocdc emulator`` must not pay for Kafka or Spark imports.
Development stand-ins (the emulated MongoDB, the local Kafka broker) add their subcommands through
the ``mongocdc.commands`` entry-point group, so the engine never imports them.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

CORE_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("mongocdc_core.run_command", "capture changes: snapshot, then stream, into a sink"),
    "tables": ("mongocdc_core.tables.command", "the Delta tables without Dagster (jars)"),
}
DEV_SUMMARIES = {
    "emulator": "run the emulated MongoDB replica set or sharded cluster (development stand-in)",
    "kafka": "run a local single-node Kafka broker (development; jars)",
    "check": "run the Dagster asset checks of selected collections (exit 1 on a blocking failure)",
}
#: The extra (``pip install 'mongocdc[<extra>]'``) a command needs beyond the core.
EXTRAS = {"emulator": "devstack", "kafka": "devstack", "check": "dagster", "tables": "spark"}


def _commands() -> dict[str, tuple[str, str]]:
    """Core subcommands plus those registered by installed development packages."""
    commands = dict(CORE_COMMANDS)
    for entry in metadata.entry_points(group="mongocdc.commands"):
        commands.setdefault(entry.name, (entry.value, DEV_SUMMARIES.get(entry.name, entry.value)))
    return commands


def _version() -> str:
    try:
        return metadata.version("mongocdc")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _usage(commands: dict[str, tuple[str, str]]) -> str:
    lines = ["usage: mongocdc [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {summary}" for name, (_, summary) in commands.items()]
    lines += ["", "Run 'mongocdc <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    commands = _commands()
    if args and args[0] in ("-V", "--version"):
        print(f"mongocdc {_version()}")
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(_usage(commands))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in commands:
        hint = f" (install 'mongocdc[{EXTRAS[name]}]')" if name in EXTRAS else ""
        print(f"mongocdc: unknown command {name!r}{hint}\n\n{_usage(commands)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(commands[name][0])
    except ImportError as exc:
        extra = EXTRAS.get(name, "all")
        print(f"mongocdc {name}: cannot load {commands[name][0]} ({exc}); install 'mongocdc[{extra}]'", file=sys.stderr)
        return 2
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
