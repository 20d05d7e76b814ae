"""mongocdc's compiled snapshot read conversion (the crate in ``native/``)."""

def document_bounds(data: bytes) -> list[int]:
    """Start offsets of the BSON documents laid end to end in ``data``, then its length."""

def convert_reads(
    data: bytes,
    bounds: list[int],
    lo: int,
    hi: int,
    key_head: bytes,
    key_tail: bytes,
    value_head: bytes,
    value_tail: bytes,
) -> tuple[list[bytes | None], list[bytes | None]]:
    """Key and value bytes of the reads ``lo..hi``; None where the Python path converts."""

def cursor_batch(reply: bytes) -> tuple[int, bytes, list[int], tuple[int, int] | None]:
    """Cursor id of a raw ``find``/``getMore`` reply, its batch's documents end to end, their bounds,
    and the cursor's ``atClusterTime`` as (time, inc)."""
