"""The code location: the project's defs folder (``mongocdc_dagster/defs``), loaded as `dg` loads it.

``workspace.yaml`` (``dagster dev -w workspace.yaml``, ``make dev``) and ``dg check defs`` / ``dg dev``
both come here; the connector is configured in ``defs/mongocdc/defs.yaml``.
"""

from pathlib import Path

from dagster import Definitions, definitions, load_from_defs_folder


@definitions
def defs() -> Definitions:
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
