"""``mongocdc tables``: the Delta tables without Dagster (a cron job, Airflow, a notebook's terminal).

- ``refresh``: each collection's changelog, then its current_state, from the landing zone (every
  collection found there, or those named), several collections at once (``--concurrency``); a
  collection with nothing new costs no Spark job;
- ``check``: each current_state against MongoDB at the table's position, one PASS / FAIL / UNVERIFIED
  line per collection with how many keys it compared (as ``mongocdc check`` does for the Dagster asset
  checks): exit 1 when one differs, 3 when one compared fewer than ``--min-coverage`` of its keys;
- ``maintain``: OPTIMIZE and VACUUM of both tables;
- ``jars``: fetch the Delta Lake and Kafka jars Spark needs (see :mod:`.jars`) into the user cache the
  tables look in, or into a directory to carry to a machine without network access.

Progress is logged as lines (Spark's tasks done, rate and ETA every 10 s); a summary line per collection
and one for the run end it. Exit codes: 0 done, 1 a refresh or check failed, 2 a usage error (an option, a
location that cannot be used, a ``--collection`` that matches nothing), 3 a check that could not verify enough.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.config.filters import matches_any
from mongocdc_core.logs import add_log_format_option, command_logging, fields
from mongocdc_core.maven import add_download_arguments, download_command
from mongocdc_core.source.errors import CdcError
from mongocdc_core.tables.changelog import (
    COLLECTION_PROPERTY,
    TableInputError,
    landing_by_collection,
    table_exists,
    table_properties,
)
from mongocdc_core.tables.collection import (
    CollectionTables,
    TableOptions,
    default_concurrency,
    maintain,
    reconcile_at_position,
    refresh_collections,
)
from mongocdc_core.tables.jars import SPARK_JARS, SparkSetupError
from mongocdc_core.tables.reconcile import DEFAULT_MIN_COVERAGE, coverage_share
from mongocdc_core.tables.session import DEFAULT_MASTER, ENV_MASTER, ENV_SPARK_LOG, spark_session

log = logging.getLogger("mongocdc.tables")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNVERIFIED = 0, 1, 2, 3


def _jars(args: argparse.Namespace) -> int:
    return download_command(SPARK_JARS, args.dir, args.repository, log)


class SelectionError(ValueError):
    """A --collection pattern that chooses no collection there is: the user's mistake (exit 2)."""


def _selected(namespaces: Sequence[str], patterns: Sequence[str], where: str) -> list[str]:
    """The namespaces matching any pattern (all of them without one), in order; a pattern that matches
    none of them is an error naming it and what there is."""
    unmatched = [p for p in patterns if not any(matches_any(ns, [p]) for ns in namespaces)]
    if unmatched:
        there = ", ".join(sorted(namespaces)) or "none"
        raise SelectionError(f"--collection {', '.join(map(repr, unmatched))} matches no collection {where} "
                             f"(there: {there})")
    return [ns for ns in sorted(namespaces) if matches_any(ns, patterns)]


def _location(text: str) -> str:
    """A --landing / --tables location: a local path, or a URI Spark reads (``s3a://``, ``abfss://``, ...)
    kept as given; a ``file://`` URI is its local path (the landing zone is listed on this machine)."""
    if text.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(text).path)
    return text if "://" in text else str(Path(text).expanduser())


def _is_local(location: str) -> bool:
    return "://" not in location


#: One collection's failure, reported on its line (anything else stops the command).
_COLLECTION_ERRORS = (TableInputError, SparkSetupError, ValueError, CdcError)


def _one_by_one(what: str, namespaces: list[str], action: Callable[[str], str]) -> Iterator[tuple[str, str | Exception, float]]:
    """``action`` per collection, a line before each: (namespace, outcome or its error, seconds)."""
    for n, namespace in enumerate(namespaces, 1):
        log.info(f"{what} {n} of {len(namespaces)}: {namespace}")
        began = time.monotonic()
        try:
            outcome: str | Exception = action(namespace)
        except _COLLECTION_ERRORS as exc:
            outcome = exc
        yield namespace, outcome, time.monotonic() - began


def _each(what: str, namespaces: list[str], outcomes: Iterable[tuple[str, str | Exception, float]]) -> int:
    """A line per collection's outcome and one for them all; 1 when any failed, 3 when none failed but
    one could not be verified."""
    if not namespaces:
        log.error(f"{what}: no collection selected")
        return EXIT_FAILED
    failed, unverified, started = 0, 0, time.monotonic()
    for namespace, outcome, seconds in outcomes:
        if isinstance(outcome, Exception):
            failed += 1
            log.error(f"FAIL  {namespace}: {outcome}", extra=fields(collection=namespace, ok=False))
            continue
        ok = not outcome.startswith(("FAIL", "UNVERIFIED"))
        failed += outcome.startswith("FAIL")
        unverified += outcome.startswith("UNVERIFIED")
        line = outcome if outcome.startswith(("PASS", "FAIL", "UNVERIFIED")) else f"done  {namespace}: {outcome}"
        (log.info if ok else log.error)(f"{line} ({seconds:.1f} s)", extra=fields(collection=namespace, ok=ok))
    elapsed = time.monotonic() - started
    log.info(f"{what}: {len(namespaces) - failed - unverified} of {len(namespaces)} collections done, {failed} "
             f"failed, {unverified} unverified, {elapsed:.1f} s",
             extra=fields(collections=len(namespaces), failed=failed, unverified=unverified,
                          seconds=round(elapsed, 1)))
    return EXIT_FAILED if failed else EXIT_UNVERIFIED if unverified else EXIT_OK


def _refresh(args: argparse.Namespace) -> int:
    if not _is_local(args.landing):
        raise TableInputError(f"--landing {args.landing}: the landing zone is listed on this machine: a local "
                              "directory or a file:// URI (the tables may be anywhere Spark writes)")
    found = landing_by_collection([args.landing])
    namespaces = _selected(list(found), args.collection, f"in the landing zone {args.landing}")
    log.info(f"landing zone {args.landing}: {sum(len(f) for f in found.values())} files of {len(found)} "
             f"collections; refreshing {len(namespaces)}")
    if not namespaces:  # nothing landed: said without starting Spark
        return _each("refresh", namespaces, iter(()))
    with _spark(args) as spark:
        return _each("refresh", namespaces, _refreshed(spark, args, found, namespaces))


def _refreshed(spark: SparkSession, args: argparse.Namespace, found: dict[str, list[str]],
               namespaces: list[str]) -> Iterator[tuple[str, str | Exception, float]]:
    """Each collection's refresh as it finishes, several at once (``refresh_collections``)."""
    options = TableOptions(delete_handling=args.delete_handling)
    work = [(CollectionTables.under(args.tables, ns), found[ns]) for ns in namespaces]
    log.info(f"up to {min(len(work), args.concurrency or default_concurrency(spark))} collections at once")
    for done in refresh_collections(spark, work, options, concurrency=args.concurrency, progress=log.info):
        if done.error is not None:
            if not isinstance(done.error, _COLLECTION_ERRORS):
                raise done.error
            yield done.namespace, done.error, 0.0
            continue
        assert done.changelog is not None and done.current_state is not None
        log_refresh, state = done.changelog, done.current_state
        line = (f"changelog +{log_refresh.rows_added} rows from {log_refresh.files_read} new files "
                f"({log_refresh.row_count} in all); current_state {state.keys_merged} keys merged, "
                f"{state.row_count} rows, position {state.position}" + ("" if done.new_data else "; nothing new"))
        yield done.namespace, line, log_refresh.work.seconds + state.work.seconds


def _tables_under(spark: SparkSession, root: str) -> dict[str, CollectionTables]:
    """namespace -> its CollectionTables, for every changelog under ``root`` (named by its own property),
    listed through Spark's file systems (a local path, ``s3a://``, ``abfss://``, ...)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a started session has its gateway
    path = jvm.org.apache.hadoop.fs.Path(root)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    folders = sorted(str(status.getPath().toString()) for status in (fs.listStatus(path) if fs.exists(path) else [])
                     if status.isDirectory() and status.getPath().getName().endswith("__changelog"))
    found: dict[str, CollectionTables] = {}
    for folder in folders:
        if not table_exists(spark, folder):
            continue
        namespace = table_properties(spark, folder).get(COLLECTION_PROPERTY)
        if namespace:
            found[namespace] = CollectionTables.under(root, namespace)
    return found


@contextmanager
def _tables_chosen(args: argparse.Namespace) -> Iterator[tuple[SparkSession, dict[str, CollectionTables], list[str]]]:
    """The session, the tables under ``--tables`` and the namespaces ``--collection`` chooses of them. A local
    location that is not a directory is an error before Spark starts."""
    if _is_local(args.tables) and not Path(args.tables).is_dir():
        raise TableInputError(f"no tables under {args.tables}: it is not a directory (refresh builds them there)")
    with _spark(args) as spark:
        tables = _tables_under(spark, args.tables)
        yield spark, tables, _selected(list(tables), args.collection, f"with tables under {args.tables}")


def _check(args: argparse.Namespace) -> int:
    try:
        cfg = ConnectorConfig.load(args.config)
    except (ConfigError, OSError) as exc:
        log.error(f"invalid configuration {args.config}: {exc}")
        return EXIT_USAGE
    with _tables_chosen(args) as (spark, tables, namespaces):

        def check(namespace: str) -> str:
            found = reconcile_at_position(spark, tables[namespace], cfg, progress=log.info,
                                          min_coverage=args.min_coverage)
            verdict = {"matches": "PASS", "dropped": "PASS", "differs": "FAIL", "unverified": "UNVERIFIED"}[found.verdict]
            return (f"{verdict}  {namespace} at {found.position}: table {found.table_rows} rows, source "
                    f"{found.source_rows}; {found.method}; {found.summary()}")

        return _each("check", namespaces, _one_by_one("check", namespaces, check))


def _maintain(args: argparse.Namespace) -> int:
    with _tables_chosen(args) as (spark, tables, namespaces):

        def tidy(namespace: str) -> str:
            figures = maintain(spark, tables[namespace], retention_hours=args.retention_hours, progress=log.info)
            return ", ".join(f"{k} {v}" for k, v in figures.items()) or "no table yet"

        return _each("maintain", namespaces, _one_by_one("maintain", namespaces, tidy))


@contextmanager
def _spark(args: argparse.Namespace) -> Iterator[SparkSession]:
    """The session for one command, stopped at its end; Spark's own log lines in ``MONGOCDC_SPARK_LOG``
    (default ``<tables>/_spark.log``, or the temporary directory's ``mongocdc_tables_spark.log`` when the
    tables are not on this machine)."""
    local = Path(args.tables) if _is_local(args.tables) else Path(tempfile.gettempdir())
    spark_log = os.environ.setdefault(
        ENV_SPARK_LOG, str(local / ("_spark.log" if _is_local(args.tables) else "mongocdc_tables_spark.log")))
    Path(spark_log).parent.mkdir(parents=True, exist_ok=True)
    master = args.master or f"{ENV_MASTER} or {DEFAULT_MASTER}"
    log.info(f"starting Spark ({master}); its own log: {spark_log}")
    spark = spark_session(args.master)
    try:
        yield spark
    finally:
        spark.stop()


def _share(text: str) -> float:
    try:
        return coverage_share(float(text), "--min-coverage")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


TABLES_HELP = "where the tables live: a directory, or a URI Spark writes to (file://, s3a://, abfss://, ...)"


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mongocdc tables", description=__doc__.split("\n\n")[0])
    add_log_format_option(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")

    def collections(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--collection", action="append", default=[], metavar="PATTERN",
                         help="'<db>.<collection>' or a glob ('inventory.*'); repeatable; default: all")
        sub.add_argument("--master", default=None, help=f"Spark master (default {ENV_MASTER} or {DEFAULT_MASTER})")

    refresh = commands.add_parser("refresh", help="refresh changelog and current_state from the landing zone")
    refresh.add_argument("--landing", type=_location, required=True,
                         help="the landing zone (Parquet files): a directory or file:// URI")
    refresh.add_argument("--tables", type=_location, required=True, help=TABLES_HELP)
    refresh.add_argument("--delete-handling", default="drop", choices=["drop", "rewrite"],
                         help="current_state drops deleted documents, or keeps them with __deleted = true")
    refresh.add_argument("--concurrency", type=_positive, default=None, metavar="N",
                         help="collections refreshed at once (default: 4, or Spark's default parallelism up to 16)")
    collections(refresh)
    check = commands.add_parser("check", help="compare each current_state with MongoDB (exit 1 on a difference)")
    check.add_argument("--config", required=True, help="the connector config (to read MongoDB)")
    check.add_argument("--tables", type=_location, required=True, help=TABLES_HELP)
    check.add_argument("--min-coverage", type=_share, default=DEFAULT_MIN_COVERAGE, metavar="SHARE",
                       help=f"no PASS below this share of keys compared (default {DEFAULT_MIN_COVERAGE})")
    collections(check)
    maintain = commands.add_parser("maintain", help="OPTIMIZE and VACUUM both tables of each collection")
    maintain.add_argument("--tables", type=_location, required=True, help=TABLES_HELP)
    maintain.add_argument("--retention-hours", type=int, default=168, help="VACUUM's retention (default 168)")
    collections(maintain)
    jars = commands.add_parser("jars", help="download the Delta Lake and Kafka jars Spark needs (Maven Central)")
    add_download_arguments(jars, SPARK_JARS)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    command_logging("mongocdc tables", args.log_format, "INFO")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection lines are not the command's events
    run = {"refresh": _refresh, "check": _check, "maintain": _maintain, "jars": _jars}[args.command]
    try:
        return run(args)
    except (SelectionError, TableInputError) as exc:  # a pattern or a location the user gave that cannot be used
        log.error(f"mongocdc tables {args.command}: {exc}")
        return EXIT_USAGE
    except SparkSetupError as exc:
        log.error(f"mongocdc tables {args.command}: {exc}")
        return EXIT_FAILED
