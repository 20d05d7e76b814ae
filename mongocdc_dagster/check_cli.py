"""``mongocdc check``: run the asset checks of selected collections headless, for CI pipelines.

No webserver, no daemon: it loads the code location (``mongocdc_dagster.definitions`` by default, or
``-m module[:attribute]``), runs the standalone asset checks of the selected collections in this process
against the deployment's Dagster instance (``DAGSTER_HOME``, so the results show in the UI too), prints
one line per check and exits 1 when a blocking check failed, 3 when none failed but one could not
verify enough (``matches_source`` compared fewer than ``--min-coverage`` of the keys: the table's
position left the server's snapshot history and too many keys changed since), 2 on a usage error::

    mongocdc check --collection inventory.orders --collection 'inventory.cust*'
    PASS  inventory/orders/current_state  matches_source  blocking  inventory.orders at ...: ...; 30 of 30 keys compared (100%); matches
    FAIL  inventory/customers/current_state  matches_source  blocking  ...: DIFFERS at 1 key(s): ...
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    Definitions,
    define_asset_job,
)
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster.components.definitions import LazyDefinitions

from mongocdc_core.config.filters import matches_any
from mongocdc_core.logs import add_log_format_option, command_logging
from mongocdc_core.tables.reconcile import DEFAULT_MIN_COVERAGE, coverage_share
from mongocdc_dagster.checks import RECONCILE_CHECK
from mongocdc_dagster.logs import NotARunsRecord, run_config

DEFAULT_TARGET = "mongocdc_dagster.definitions:defs"
#: Exit codes: a blocking check failed; a usage error; a blocking check could not verify enough.
EXIT_FAILED, EXIT_USAGE, EXIT_UNVERIFIED = 1, 2, 3


def load_definitions(target: str) -> Definitions:
    """``module[:attribute]`` -> Definitions (a ``@definitions`` function is called, as a code server does)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attribute or "defs")
    if isinstance(value, LazyDefinitions):
        DefinitionsLoadContext.set(DefinitionsLoadContext(load_type=DefinitionsLoadType.INITIALIZATION))
        value = value()
    if not isinstance(value, Definitions):
        raise SystemExit(f"mongocdc check: {target} is not a Dagster Definitions object")
    return value


def _collections(defs: Definitions) -> dict[AssetKey, str]:
    """Asset key -> the collection it belongs to (the translator's ``mongocdc/collection`` metadata)."""
    return {spec.key: str(spec.metadata["mongocdc/collection"]) for spec in defs.resolve_all_asset_specs()
            if "mongocdc/collection" in spec.metadata}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mongocdc check", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("-m", "--module", default=DEFAULT_TARGET, help=f"code location (default {DEFAULT_TARGET})")
    parser.add_argument("-c", "--collection", action="append", default=[],
                        help="collection ('db.coll', shell wildcards allowed); repeat; default: all")
    parser.add_argument("--check", action="append", default=[], help="only checks of this name; repeat")
    parser.add_argument("--min-coverage", type=float, default=DEFAULT_MIN_COVERAGE, metavar="SHARE",
                        help=f"{RECONCILE_CHECK}: the share of keys it must compare to pass "
                             f"(default {DEFAULT_MIN_COVERAGE})")
    add_log_format_option(parser)
    args = parser.parse_args(argv)
    try:
        coverage_share(args.min_coverage, "--min-coverage")
    except ValueError as exc:
        parser.error(str(exc))
    # this process's log lines (from WARNING on) and the check run's console lines (mongocdc_dagster.logs) alike
    fmt, handler = command_logging("mongocdc check", args.log_format, "WARNING")
    handler.addFilter(NotARunsRecord())
    defs = load_definitions(args.module)
    graph = defs.get_repository_def().asset_graph
    check_keys = sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name))
    collections = _collections(defs)
    selected: list[AssetCheckKey] = []
    for key in check_keys:
        namespace = collections.get(key.asset_key)
        if args.collection and (namespace is None or not matches_any(namespace, args.collection)):
            continue
        if args.check and key.name not in args.check:
            continue
        # checks declared on a multi-asset run only when it materialises; the standalone ones run here
        if not graph.assets_def_for_key(key).keys:
            selected.append(key)
    if not selected:
        print(f"mongocdc check: no standalone asset check matches collections {args.collection or 'all'}"
              f" and checks {args.check or 'all'}", file=sys.stderr)
        return EXIT_USAGE
    job = define_asset_job("mongocdc_ci_checks", selection=AssetSelection.checks(*selected))
    resolved = Definitions.merge(defs, Definitions(jobs=[job])).resolve_job_def("mongocdc_ci_checks")
    # the config goes to the op of the reconciliation check when it is selected (a job rejects config of ops it lacks)
    # (and the run's console lines are mongocdc's, in the command's format)
    config = {**run_config(fmt),
              "ops": {graph.assets_def_for_key(k).node_def.name: {"config": {"min_coverage": args.min_coverage}}
                      for k in selected if k.name == RECONCILE_CHECK}}
    with DagsterInstance.get() as instance:
        result = resolved.execute_in_process(instance=instance, raise_on_error=False, run_config=config)
    evaluations = {(e.asset_key, e.check_name): e for e in result.get_asset_check_evaluations()}
    blocking = {k for k in selected if graph.get_check_spec(k).blocking}
    failed_blocking = unverified_blocking = 0
    for key in selected:
        evaluation = evaluations.get((key.asset_key, key.name))
        kind = "blocking" if key in blocking else "non-blocking"
        if evaluation is None:
            status, text = "ERROR", "did not run (see the run's logs: " + result.run_id + ")"
            failed_blocking += key in blocking
        else:
            warn = evaluation.severity == AssetCheckSeverity.WARN
            verdict = evaluation.metadata.get("verdict")
            unverified = verdict is not None and verdict.value == "unverified"
            status = ("PASS" if evaluation.passed else "UNVERIFIED" if unverified else "WARN" if warn else "FAIL")
            text = evaluation.description or ""
            if not evaluation.passed and key in blocking:
                if unverified:  # a warning in Dagster (it blocks nothing), but the command was asked to verify
                    unverified_blocking += 1
                elif not warn:  # a warning blocks nothing
                    failed_blocking += 1
        print(f"{status:<5} {key.asset_key.to_user_string()}  {key.name}  {kind}  {text}", flush=True)
    print(f"{len(selected)} check(s), {failed_blocking} blocking failure(s), {unverified_blocking} not verified",
          flush=True)
    return EXIT_FAILED if failed_blocking else EXIT_UNVERIFIED if unverified_blocking else 0


if __name__ == "__main__":
    sys.exit(main())
