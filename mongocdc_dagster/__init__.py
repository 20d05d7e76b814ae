"""mongocdc's Dagster integration: ``MongoCdcComponent`` (defs.yaml), the translator, and the builder."""

from mongocdc_dagster.component import MongoCdcComponent
from mongocdc_dagster.translator import MongoCdcAssetProps, MongoCdcTranslator

__all__ = ["MongoCdcAssetProps", "MongoCdcComponent", "MongoCdcTranslator"]
