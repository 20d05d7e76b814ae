"""The ``mongocdc`` command: one entry point whose subcommands live with the code they run.

Each subcommand module parses its own arguments (``main(argv) -> int``), so this file only routes
and stays free of heavy imports: ``mongocdc emulator`` must not pay for Kafka or Spark imports.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("mongocdc_core.runner", "capture changes: snapshot, then stream, into a sink"),
    "emulator": ("mongocdc_core.devstack.server", "run the emulated MongoDB replica set (development stand-in)"),
    "kafka": ("mongocdc_core.devstack.kafka_broker", "run a local single-node Kafka broker (development)"),
}


def _usage() -> str:
    lines = ["usage: mongocdc <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "Run 'mongocdc <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"mongocdc: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
