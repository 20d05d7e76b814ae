"""The connection string and secrets: reading URI options, masking what must never be shown."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote

_SECRET_WORDS = ("password", "secret", "jaas", "token", "credential")
MASK = "********"


def is_secret(prop: str) -> bool:
    """Whether a property's value must be masked wherever it is shown."""
    lowered = prop.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def mask_connection_string(uri: str) -> str:
    """Hide the password in `mongodb://user:pass@host`."""
    return re.sub(r"^(mongodb(?:\+srv)?://[^:/@]*:)[^@/]*@", lambda m: m.group(1) + MASK + "@", uri)


def uri_parts(uri: str) -> tuple[bool, dict[str, str]]:
    """Whether the URI carries credentials, and its options keyed by lower-case name."""
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    authority, _, tail = rest.partition("/")
    if "?" in authority:
        authority, _, query = authority.partition("?")
    else:
        query = tail.partition("?")[2]
    has_user = "@" in authority
    options = {k.lower(): unquote(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    return has_user, options


def replica_set_uri(uri: str, shard_host: str) -> str:
    """The connection string of one shard, from the connector's (through mongos) and the shard's ``host`` in
    ``config.shards`` (``<replica set>/<host:port>,...``), as Debezium builds it to connect to a shard.

    The credentials, database and options are kept, the hosts replaced, ``replicaSet`` set to the shard's
    (``directConnection``, ``loadBalanced`` and the SRV-only options dropped: they describe the connection to
    mongos). A
    ``mongodb+srv`` string becomes ``mongodb`` with ``tls=true``, which SRV implied.
    """
    scheme, _, rest = uri.partition("://")
    authority, slash, tail = rest.partition("/")
    if not slash and "?" in authority:
        authority, _, query = authority.partition("?")
        path = ""
    else:
        path, _, query = tail.partition("?")
    userinfo = authority.rpartition("@")[0]
    set_name, _, members = shard_host.rpartition("/")
    dropped = {"replicaset", "directconnection", "loadbalanced", "srvservicename", "srvmaxhosts"}
    options = [part for part in query.split("&") if part and part.split("=", 1)[0].lower() not in dropped]
    if scheme == "mongodb+srv" and not any(p.split("=", 1)[0].lower() in ("tls", "ssl") for p in options):
        options.append("tls=true")
    if set_name:
        options.append(f"replicaSet={set_name}")
    return f"mongodb://{userinfo + '@' if userinfo else ''}{members}/{path}" + (f"?{'&'.join(options)}" if options else "")
