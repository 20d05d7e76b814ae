"""The Prometheus exporter: the connector metrics served over HTTP in Prometheus text format.

Names and labels are the ones Debezium's own monitoring setup produces when the Prometheus JMX
exporter scrapes the connector's MBeans: ``debezium_metrics_<Attribute>`` with the labels
``plugin="mongodb"``, ``context`` (``snapshot`` or ``streaming``), ``server`` (``topic.prefix``) and
``task``, plus every ``custom.metric.tags`` pair; ``RowsScanned`` has one series per collection
(label ``table``). Dashboards written for Debezium therefore work unchanged. Values are read when a
scrape arrives, so the exporter costs nothing between scrapes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mongocdc_core.metrics.model import ConnectorMetrics

METRIC_PREFIX = "debezium_metrics_"


class _ConnectorCollector(Collector):
    """Turns the metric model into Prometheus families at scrape time."""

    def __init__(self, metrics: ConnectorMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        base = {"plugin": "mongodb", "server": self.metrics.server, "task": "0", **self.metrics.tags}
        for context, attributes in self.metrics.contexts().items():
            labels = {**base, "context": context}
            for attribute, value in attributes.items():
                if attribute == "RowsScanned" and isinstance(value, Mapping):
                    family = _family(families, attribute, [*labels, "table"])
                    for table, rows in sorted(value.items()):
                        family.add_metric([*labels.values(), table], float(rows))
                elif isinstance(value, bool | int | float):
                    _family(families, attribute, list(labels)).add_metric(list(labels.values()), float(value))
        yield from families.values()


def _family(families: dict[str, GaugeMetricFamily], attribute: str, labels: list[str]) -> GaugeMetricFamily:
    if attribute not in families:
        families[attribute] = GaugeMetricFamily(
            f"{METRIC_PREFIX}{attribute}", f"Debezium MongoDB connector metric {attribute}", labels=labels
        )
    return families[attribute]


class PrometheusExporter:
    """Serves ``metrics`` on ``http://<addr>:<port>/metrics`` until :meth:`stop`.

    Port 0 picks a free port (read it back from :attr:`port`); the property ``mongocdc.metrics.port``
    uses 0 for "no exporter", so only code that wants an ephemeral port passes 0 here.
    """

    def __init__(self, metrics: ConnectorMetrics, port: int, *, addr: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ConnectorCollector(metrics))
        self._requested = (addr, port)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port actually listened on."""
        if self._server is None:
            raise RuntimeError("the Prometheus exporter is not started")
        return int(self._server.server_address[1])

    def start(self) -> PrometheusExporter:
        """Start listening; an unusable port raises ``OSError`` naming it."""
        addr, port = self._requested
        try:
            self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        return self

    def stop(self) -> None:
        """Stop serving and free the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> PrometheusExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
