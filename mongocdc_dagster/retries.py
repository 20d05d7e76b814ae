"""What is retried after a CDC run fails, and by whom: Dagster's split between steps and runs.

- A step that fails on something transient (a primary step-down, MongoDB or the broker briefly out) is run
  again inside its run by its ``RetryPolicy`` (:data:`STEP_RETRY_POLICY`, with a growing pause). A step
  that raises ``Failure(allow_retries=False)`` ("history lost", a bad snapshot filter) is not: Dagster's
  step retries skip it, and running it again would only fail the same way.
- A run that fails as a whole (its worker killed, the daemon restarted under it, a run that never started)
  is run again by Dagster's run retries (``run_retries: enabled`` in dagster.yaml) for the runs tagged with
  :data:`RUN_RETRY_TAGS`: the latest-window schedule's slice runs, the sensors' snapshot runs and the table
  automation's refreshes. The tags say "not after a step failure" (``dagster/retry_on_asset_or_op_failure:
  false``): a slice or snapshot step's own policy has already retried what was worth retrying, and a table
  refresh whose step failed is requested again by the automation after its back-off
  (``MongoCdcTranslator.failed_refresh_retry_cron``), so a run failed by its step is not run twice more.
- A run still to finish (:func:`in_flight`): queued, starting or running, or failed and marked to be retried
  (Dagster's ``dagster/will_retry`` tag): the schedule and the gap sensor request nothing new behind it.
- The gap sensor's repair runs get no run retries: the sensor is their retrier (``gaps.py``), with a back-off.
- A slice run whose worker died with the code server that launched it (the one a daemon started for itself
  from a ``python_module`` workspace, ended with that daemon; a deployment's own code server, docs/dagster.md,
  outlives a daemon restart) would stay STARTED for ever: Dagster's default run launcher cannot see its worker,
  and the schedule requests nothing behind a run in flight. So slice runs carry a maximum run time
  (:func:`slice_max_runtime`), after which run monitoring terminates them and the schedule lands their windows
  again. The table automation's refreshes, which would hold the tables' pool as long, carry one too
  (:func:`table_run_tags`); the failed run is then run again by the run retries.
- A run that is terminated (the UI, a stop-snapshot signal) stops: :func:`stop_when_terminated` turns the
  interrupt Dagster raises in the step into a failure no policy retries (a ``RetryPolicy`` would otherwise
  run the step again in the terminated run, since Dagster retries an interrupted step under it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import AssetExecutionContext, Backoff, DagsterRun, DagsterRunStatus, Failure, Jitter, RetryPolicy
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.storage.tags import (
    MAX_RETRIES_TAG,
    MAX_RUNTIME_SECONDS_TAG,
    RETRY_ON_ASSET_OR_OP_FAILURE_TAG,
    WILL_RETRY_TAG,
)

#: Step retries of the snapshot and slice assets: 15 s, 45 s, then 105 s (about) after the failure; together
#: longer than a replica set's election and a broker restart, shorter than a few one-minute windows.
STEP_RETRY_POLICY = RetryPolicy(max_retries=3, delay=15, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)
#: How often a run that failed as a whole is run again.
RUN_RETRIES = 2
#: The tags of the runs mongocdc requests (slices, snapshots, table refreshes): run retries for run-level failures
#: only.
RUN_RETRY_TAGS = {MAX_RETRIES_TAG: str(RUN_RETRIES), RETRY_ON_ASSET_OR_OP_FAILURE_TAG: "false"}

#: The least maximum run time of a slice run (:func:`slice_max_runtime`).
MIN_SLICE_RUNTIME_S = 900


def slice_max_runtime(span_seconds: int) -> dict[str, str]:
    """The tag giving a slice run over windows spanning ``span_seconds`` its maximum run time: that span, at
    least :data:`MIN_SLICE_RUNTIME_S`. A run streaming its windows slower than the source wrote them could not
    catch up anyway; past it, the run is taken for one whose worker is gone, and run monitoring ends it."""
    return {MAX_RUNTIME_SECONDS_TAG: str(max(MIN_SLICE_RUNTIME_S, span_seconds))}


def table_run_tags(max_runtime_seconds: int) -> dict[str, str]:
    """The tags of the table automation's refresh runs: :data:`RUN_RETRY_TAGS` and their maximum run time."""
    return RUN_RETRY_TAGS | {MAX_RUNTIME_SECONDS_TAG: str(max_runtime_seconds)}


_TERMINATING = (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)
#: The statuses of a run not ended yet.
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def in_flight(run: DagsterRun) -> bool:
    """The run, or the retry Dagster will launch of it, is still to finish."""
    return run.status in ACTIVE or (run.status == DagsterRunStatus.FAILURE and run.tags.get(WILL_RETRY_TAG) == "true")


@contextmanager
def stop_when_terminated(context: AssetExecutionContext) -> Iterator[None]:
    """Wraps a step's body: an interrupt of a run being terminated ends the step, never retried; any other
    interrupt (the worker's process told to stop) stays an interrupt, for the step's policy and Dagster."""
    try:
        yield
    except (DagsterExecutionInterruptedError, KeyboardInterrupt) as exc:
        run = context.instance.get_run_by_id(context.run_id)
        if run is not None and run.status in _TERMINATING:
            raise Failure(f"run {context.run_id} was terminated", allow_retries=False) from exc
        raise
