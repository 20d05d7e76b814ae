"""The README's example connector is a config mongocdc accepts, as a newcomer will copy it."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.figures import ROOT
from mongocdc_core.config import ConnectorConfig


def test_the_readme_connector_is_valid_and_takes_its_password_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"```json\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None, "the README shows a connector config"
    monkeypatch.setenv("MONGODB_PASSWORD", "from-the-environment")
    config = ConnectorConfig.from_dict(json.loads(block.group(1)))
    assert config.mongodb_password == "from-the-environment" and config.topic_prefix == "shop"
