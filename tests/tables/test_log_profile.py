"""mongocdc's log4j2 profile drops exactly Delta's harmless "Failed to translate filter" ERRORs.

Spark itself is not started here: the messages are the ones Delta logged in this project's sessions (a scan of a
table with deletion vectors, a read of a change data feed), and log4j2's ``RegexFilter`` matches a message as a
whole, as ``re.fullmatch`` does.
"""

from __future__ import annotations

import re

from mongocdc_core.tables.session import LOG4J2

_KEY = "logger.deltaparquet.filter.rowdeleted.regex"


def _dropped() -> re.Pattern[str]:
    for line in LOG4J2.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == _KEY:
            return re.compile(value.strip())
    raise AssertionError(f"{LOG4J2} has no {_KEY}")


def test_delta_messages_on_columns_not_in_the_files_are_dropped() -> None:
    dropped = _dropped()
    assert dropped.fullmatch("Failed to translate filter EqualTo(__delta_internal_is_row_deleted,0)")
    assert dropped.fullmatch("Failed to translate filter In(_change_type, [delete,insert,update_postimage])")
    assert dropped.fullmatch("Failed to translate filter EqualTo(_change_type,insert)")


def test_any_other_message_of_that_logger_still_shows() -> None:
    dropped = _dropped()
    assert not dropped.fullmatch("Failed to translate filter EqualTo(customer_id,42)")
    assert not dropped.fullmatch("Failed to read the Parquet footer of part-00000.parquet")
