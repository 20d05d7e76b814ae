"""Connector metrics: the model (Debezium's snapshot and streaming attributes) and its exporters.

``model`` holds the counters the engine updates; ``json_file`` rewrites them as a JSON file and
``prometheus`` serves them over HTTP for a monitoring system to scrape.
"""

from mongocdc_core.metrics.model import ConnectorMetrics, SnapshotMetrics, StreamingMetrics

__all__ = ["ConnectorMetrics", "SnapshotMetrics", "StreamingMetrics"]
