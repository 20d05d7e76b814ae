"""``mongocdc tables``: the tables' own command, for users without Dagster.

``mongocdc tables jars`` fetches the Delta Lake and Kafka jars Spark needs (see :mod:`.jars`), into the
user cache the tables look in, or into a directory to carry to a machine without network access.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mongocdc_core.tables.jars import ENV_JARS, Artifact, SparkSetupError, download, user_cache


def _jars(folder: Path | None, repository: str | None) -> int:
    target = folder if folder is not None else user_cache()

    def report(done: int, total: int, artifact: Artifact) -> None:
        print(f"[{done}/{total}] {artifact.coordinate}", flush=True)

    try:
        paths = download(target, repository, report)
    except SparkSetupError as exc:
        print(f"mongocdc tables jars: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} jars ({size / 1e6:.1f} MB) in {target}")
    if folder is not None:
        print(f"point the tables at them with {ENV_JARS}={target}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mongocdc tables", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    jars = commands.add_parser("jars", help="download the Delta Lake and Kafka jars Spark needs (Maven Central)")
    jars.add_argument("--dir", type=Path, default=None,
                      help=f"put them here (default: {user_cache()}, where the tables look without {ENV_JARS})")
    jars.add_argument("--repository", default=None,
                      help="a Maven repository to fetch from (default: MONGOCDC_MAVEN_REPOSITORY or Maven Central)")
    args = parser.parse_args(argv)
    return _jars(args.dir, args.repository)
