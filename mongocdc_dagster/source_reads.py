"""The sources read early for a run's reconciliations (``matches_source``).

A table refresh run refreshes each collection's changelog, then its current_state, then reconciles each
table with its collection at the table's position. That position is known once a collection's changelog is
refreshed (current_state folds it up to its latest version), and the server still holds it then; by the time the
check runs, minutes later on a busy machine, it may not (its snapshot history, 300 s by default), and a
hot collection's check would compare too few keys. So the tables step starts each collection's read
(``read_source_at``, through pymongo, in the background) as soon as its changelog is refreshed, and the
check step takes it; ``compare`` uses it only when the table holds that changelog version and position.

The steps share a process under the in-process executor (the default of every job here); with another
executor, or when a read is dropped, the check reads the source itself, as it always could.

What is held, and for how long: per collection whose ``matches_source`` the run executes and whose
changelog gained something, its rows in Arrow form (about the size of its documents as JSON), from the
end of its changelog refresh until its check takes them (or the check step ends, or another run's reads
start in this process: one run per process is the rule of Dagster's run workers). A run over hundreds of
quiet collections with nothing new holds none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from dagster import AssetCheckKey, AssetExecutionContext

from mongocdc_core.tables.collection import SourceRead

RECONCILE_CHECK = "matches_source"
#: Reads run at once in the background (each mostly waits on MongoDB; they overlap current_state's refresh).
READERS = 2


def checks_in_run(context: AssetExecutionContext) -> set[AssetCheckKey]:
    """The asset checks this run executes: its check selection, or every check of its job's assets."""
    selected = context.run.asset_check_selection
    if selected is not None:
        return set(selected)
    return {key for data in context.job_def.asset_layer.data for key in data.assets_def.check_keys}


class EarlyReads:
    """Reads started in the background, each for one run and collection, taken once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], Future[SourceRead]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def start(self, run_id: str, namespace: str, read: Callable[[], SourceRead]) -> None:
        """Run ``read`` in the background for ``namespace``'s check in run ``run_id`` (dropping what other
        runs left: a run whose check never came, as when its refresh failed)."""
        with self._lock:
            for key in [k for k in self._reads if k[0] != run_id or k[1] == namespace]:
                self._reads.pop(key).cancel()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="mongocdc-source-reads")
            self._reads[(run_id, namespace)] = self._pool.submit(read)

    def take(self, run_id: str, namespace: str) -> SourceRead | Exception | None:
        """The read started for ``namespace`` in run ``run_id`` once it is done, the error it raised, or
        None when none was started."""
        with self._lock:
            future = self._reads.pop((run_id, namespace), None)
        if future is None:
            return None
        try:
            return future.result()
        except CancelledError:
            return None
        except Exception as exc:  # the caller reads the source itself, and says why
            return exc

    def drop(self, run_id: str) -> None:
        """Forget the reads of run ``run_id`` no check took."""
        with self._lock:
            for key in [k for k in self._reads if k[0] == run_id]:
                self._reads.pop(key).cancel()


#: The process's early reads (the tables step starts them, the reconciliation step takes them).
EARLY_READS = EarlyReads()
