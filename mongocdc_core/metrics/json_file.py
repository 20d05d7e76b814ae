"""The JSON file exporter: the metrics rewritten atomically every few seconds while a run lasts."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


class JsonFileExporter:
    """Writes ``read()`` to ``path`` now (``write``) or every ``interval_s`` seconds (``start``/``stop``)."""

    def __init__(self, read: Callable[[], dict[str, Any]], path: str | os.PathLike[str], interval_s: float = 2.0) -> None:
        self.read = read
        self.path = Path(path)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> None:
        """Replace the file atomically, so a reader never sees half a document."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(orjson.dumps(self.read(), option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def start(self) -> None:
        """Write now, then every ``interval_s`` seconds on a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self.write()

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.write()

        self._thread = threading.Thread(target=loop, name="mongocdc-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic writes (the caller writes the final values if it wants them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
