"""The code location loads and validates as Dagster's own CLI sees it, and the resources compose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mongocdc_core.sinks.tee import TeeSink
from mongocdc_dagster import local_stack
from mongocdc_dagster.definitions import build_definitions
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource
from mongocdc_dagster.settings import CdcSettings


def test_dagster_definitions_validate_passes_on_the_workspace(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONGOCDC_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(tmp_path)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=local_stack.REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_defaults_point_at_the_local_stack() -> None:
    settings = CdcSettings.from_env({})
    assert settings.config_path == local_stack.DEFAULT_CONFIG and settings.home == local_stack.DEFAULT_HOME
    defs = build_definitions(settings)
    assert {"mongocdc", "kafka", "pyspark"} <= set(defs.resources or {})
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"mongocdc/snapshot", "mongocdc/stream_slice"} <= keys
    cfg = defs.resources["mongocdc"].load_config()  # type: ignore[index]
    assert cfg.mongodb_connection_string == local_stack.emulator_uri()


def test_password_secret_overrides_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.properties"
    config.write_text("mongodb.connection.string=mongodb://127.0.0.1:1/\ntopic.prefix=p\nmongodb.user=cdc\n")
    resource = MongoCdcResource(config_path=str(config), home=str(tmp_path), mongodb_password="s3cret")
    assert resource.load_config().mongodb_password == "s3cret"
    assert MongoCdcResource(config_path=str(config), home=str(tmp_path)).load_config().mongodb_password is None


class _Memory:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.flushed = self.closed = 0

    def write(self, records: Any) -> None:
        self.records.extend(records)

    def flush(self, timeout: float | None = None) -> None:
        self.flushed += 1

    def close(self) -> None:
        self.closed += 1


def test_tee_sink_delivers_to_every_sink_and_kafka_needs_a_bootstrap() -> None:
    a, b = _Memory(), _Memory()
    tee = TeeSink([a, b])
    tee.write(["r1", "r2"])  # type: ignore[list-item]
    tee.flush()
    tee.close()
    assert a.records == b.records == ["r1", "r2"] and a.flushed == b.flushed == 1 and a.closed == b.closed == 1
    kafka = MongoCdcKafkaResource()
    assert not kafka.enabled
    with pytest.raises(ValueError, match="MONGOCDC_KAFKA_BOOTSTRAP"):
        kafka.open_sink(MongoCdcResource(config_path=str(local_stack.DEFAULT_CONFIG), home="/tmp/x").load_config())
