"""One connector in its own process, for the kill -9 tests.

``python connector_proc.py CONFIG SINK OFFSETS`` opens the sink and the offset store through the same
factories ``mongocdc run`` uses, prints ``READY`` once streaming started, and runs until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.offsets import open_offset_store
from mongocdc_core.positions import Position
from mongocdc_core.sinks.factory import open_sink


class Ready(ProgressListener):
    def streaming_started(self, position: Position | None) -> None:
        print("READY", flush=True)


def main(argv: list[str]) -> int:
    config_path, sink_spec, offsets_spec = argv
    cfg = ConnectorConfig.load(config_path)
    sink = open_sink(sink_spec, cfg)
    offsets = open_offset_store(offsets_spec, cfg, sink)
    engine = Engine(cfg, sink, offsets, progress=Ready())

    def stop(signum: int, frame: FrameType | None) -> None:
        engine.stop()

    signal.signal(signal.SIGTERM, stop)
    try:
        engine.run()
    finally:
        sink.close()
        offsets.close()
    print("STOPPED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
