"""Maps the connector's CDC outputs to Dagster asset specs; subclass it to rename, regroup or retag.

Modelled on ``DagsterSlingTranslator``: every aspect of a spec has its own overridable method, and
``get_asset_spec`` assembles them. Collections are partitions of these assets, not separate assets, so
per-collection facts go in ``get_collection_metadata`` which each materialisation carries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dagster import AssetKey, AssetSpec, MetadataValue

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.naming import TopicNamingStrategy

CdcKind = Literal["snapshot", "incremental_snapshot", "stream_slice"]
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

_DESCRIPTIONS: dict[str, str] = {
    "snapshot": (
        "Blocking snapshot of one collection: every document as a Debezium read (`op: r`) record, all "
        "carrying the cluster position taken before the copy started."
    ),
    "incremental_snapshot": (
        "Incremental (chunked, watermarked) snapshot of one collection, readable while streaming continues."
    ),
    "stream_slice": (
        "Change events of one collection in the half-open clusterTime window [start, end) as Debezium "
        "change event records; re-materialising a window yields the same events while the oplog holds them."
    ),
}


@dataclass(frozen=True)
class CdcAssetProps:
    """What the translator knows about one CDC output of one connector."""

    kind: CdcKind
    connector_name: str
    topic_prefix: str
    landing_dir: str
    topics: TopicNamingStrategy = field(compare=False, repr=False)

    @classmethod
    def from_config(cls, kind: CdcKind, cfg: ConnectorConfig, landing_dir: str) -> CdcAssetProps:
        return cls(kind, cfg.name or cfg.topic_prefix, cfg.topic_prefix, landing_dir, cfg.topic_naming())


def _tag_value(text: str) -> str:
    """Dagster tag values allow letters, digits, `_.-` and at most 63 characters."""
    return _TAG_UNSAFE.sub("_", text)[:63]


class MongoCdcTranslator:
    """Default naming: keys `["mongocdc", <kind>]`, group `mongocdc`, kinds mongodb and parquet."""

    key_prefix: Sequence[str] = ("mongocdc",)

    def get_asset_key(self, props: CdcAssetProps) -> AssetKey:
        return AssetKey([*self.key_prefix, props.kind])

    def get_group_name(self, props: CdcAssetProps) -> str:
        return "mongocdc"

    def get_tags(self, props: CdcAssetProps) -> Mapping[str, str]:
        return {"mongocdc/kind": props.kind, "mongocdc/connector": _tag_value(props.connector_name)}

    def get_kinds(self, props: CdcAssetProps) -> set[str]:
        return {"mongodb", "parquet"}

    def get_owners(self, props: CdcAssetProps) -> Sequence[str]:
        return []

    def get_description(self, props: CdcAssetProps) -> str:
        return _DESCRIPTIONS[props.kind]

    def get_metadata(self, props: CdcAssetProps) -> Mapping[str, Any]:
        return {
            "mongocdc/connector": props.connector_name,
            "mongocdc/topic_prefix": props.topic_prefix,
            "mongocdc/landing": MetadataValue.path(f"{props.landing_dir}/{props.kind}"),
        }

    def get_collection_metadata(self, props: CdcAssetProps, namespace: str) -> Mapping[str, Any]:
        """Facts about one collection attached to each of its materialisations."""
        db, _, coll = namespace.partition(".")
        return {"collection": namespace, "database": db, "topic": props.topics.data_change_topic(db, coll)}

    def get_asset_spec(self, props: CdcAssetProps) -> AssetSpec:
        return AssetSpec(
            key=self.get_asset_key(props),
            group_name=self.get_group_name(props),
            tags=self.get_tags(props),
            kinds=self.get_kinds(props),
            owners=self.get_owners(props),
            description=self.get_description(props),
            metadata=self.get_metadata(props),
        )
