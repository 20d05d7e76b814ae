"""Errors the engine raises; every message says what went wrong and how to recover."""

from __future__ import annotations

from bson import Timestamp


class CdcError(RuntimeError):
    """Base class of engine failures a user has to act on."""


class TopologyError(CdcError):
    """The deployment cannot be captured (a standalone server has no oplog)."""


class ConnectError(CdcError):
    """MongoDB stayed unreachable through every reconnection attempt."""


class OversizeEventError(CdcError):
    """A change event exceeded the 16 MiB BSON limit with ``cursor.oversize.handling.mode=fail``."""


def _fmt(ts: Timestamp | None) -> str:
    return "unknown" if ts is None else f"Timestamp({ts.time}, {ts.inc})"


class HistoryLostError(CdcError):
    """The position to resume from has left the oplog: continuing would silently skip changes."""

    def __init__(self, message: str, *, position: Timestamp | None = None, oplog_first: Timestamp | None = None):
        super().__init__(message)
        self.position = position
        self.oplog_first = oplog_first

    @classmethod
    def for_offset(
        cls, position: Timestamp | None, oplog_first: Timestamp | None, snapshot_mode: str, offsets: str
    ) -> HistoryLostError:
        """The seed's "connector fails after it is stopped for a long interval" situation."""
        return cls(
            f"the recorded offset (clusterTime {_fmt(position)}) is no longer in the oplog (its first entry "
            f"is {_fmt(oplog_first)}): the changes in between were purged, so streaming cannot resume without "
            f"a gap (ChangeStreamHistoryLost). With snapshot.mode={snapshot_mode} the connector does not "
            "re-snapshot on its own. To recover: remove the stored offsets "
            f"({offsets}) or start a connector with a different name, so that it takes a new snapshot; or "
            "set snapshot.mode=when_needed to re-snapshot automatically. To prevent it, enlarge the oplog "
            "(replSetResizeOplog) or set heartbeat.interval.ms so offsets advance while only uncaptured "
            "collections change.",
            position=position,
            oplog_first=oplog_first,
        )

    @classmethod
    def for_window(cls, start: Timestamp, end: Timestamp, oplog_first: Timestamp | None) -> HistoryLostError:
        """A stream slice whose start has left the oplog."""
        return cls(
            f"history lost for window [{_fmt(start)}, {_fmt(end)}): the oplog now starts at "
            f"{_fmt(oplog_first)}, after the window's start, so the events of this window can no longer "
            "be read. Re-snapshot the collection (its snapshot position supersedes the lost window).",
            position=start,
            oplog_first=oplog_first,
        )


class SnapshotReadUnavailable(CdcError):
    """A read at a past cluster time was refused: the server no longer keeps that point in its snapshot
    history (``minSnapshotHistoryWindowInSeconds``), or does not support ``atClusterTime`` reads."""


class ChangeStreamFailedError(CdcError):
    """The server ended the change stream with an error resuming cannot fix (e.g. code 280)."""


class AuthenticationError(CdcError):
    """MongoDB refused the credentials in ``mongodb.connection.string`` (code 18)."""


class PrivilegeError(AuthenticationError):
    """The connector's MongoDB user lacks a privilege an operation needs (code 13, Unauthorized)."""


class TlsError(CdcError):
    """The TLS handshake failed: the server's certificate is not trusted or names another host."""


class Stopped(Exception):
    """``stop()`` was asked while the engine was still connecting: a clean stop, not an error."""


class OffsetInvalidError(CdcError):
    """Stored offsets belong to another deployment and ``mongodb.allow.offset.invalidation`` is false."""
