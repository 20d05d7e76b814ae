"""Authentication and user management: SASL (SCRAM), createUser, createRole, usersInfo, connectionStatus.

The handlers only need ``server.access`` (an ``AccessControl``), the connection, the database and
the command, so the emulated mongos serves the same functions (``HANDLERS``) for its own users.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from . import command

if TYPE_CHECKING:
    from ..auth import AccessControl


class _Server(Protocol):
    access: AccessControl


class AuthContext(Protocol):
    """What an authentication handler reads from the command context (mongod's or mongos')."""

    @property
    def server(self) -> _Server: ...

    @property
    def conn(self) -> Any: ...

    @property
    def db(self) -> str: ...

    @property
    def cmd(self) -> dict[str, Any]: ...


@command("saslStart")
def sasl_start(ctx: AuthContext) -> dict[str, Any]:
    return ctx.server.access.sasl_start(ctx.conn, ctx.db, ctx.cmd)


@command("saslContinue")
def sasl_continue(ctx: AuthContext) -> dict[str, Any]:
    return ctx.server.access.sasl_continue(ctx.conn, ctx.db, ctx.cmd)


@command("logout")
def logout(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.logout(ctx.conn)
    return {}


@command("connectionStatus")
def connection_status(ctx: AuthContext) -> dict[str, Any]:
    return ctx.server.access.connection_status(ctx.conn, bool(ctx.cmd.get("showPrivileges")))


@command("createUser")
def create_user(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.create_user(ctx.db, ctx.cmd)
    return {}


@command("updateUser")
def update_user(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.update_user(ctx.db, ctx.cmd)
    return {}


@command("dropUser")
def drop_user(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.drop_user(ctx.db, ctx.cmd.get("dropUser"))
    return {}


@command("dropAllUsersFromDatabase")
def drop_all_users(ctx: AuthContext) -> dict[str, Any]:
    return {"n": ctx.server.access.drop_all_users(ctx.db)}


@command("grantRolesToUser", "revokeRolesFromUser")
def grant_roles(ctx: AuthContext) -> dict[str, Any]:
    grant = "grantRolesToUser" in ctx.cmd
    name = ctx.cmd.get("grantRolesToUser" if grant else "revokeRolesFromUser")
    ctx.server.access.grant_roles(ctx.db, name, ctx.cmd.get("roles", []), grant)
    return {}


@command("usersInfo")
def users_info(ctx: AuthContext) -> dict[str, Any]:
    return {"users": ctx.server.access.users_info(ctx.db, ctx.cmd.get("usersInfo"), bool(ctx.cmd.get("showCredentials")))}


@command("createRole")
def create_role(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.create_role(ctx.db, ctx.cmd)
    return {}


@command("dropRole")
def drop_role(ctx: AuthContext) -> dict[str, Any]:
    ctx.server.access.drop_role(ctx.db, ctx.cmd.get("dropRole"))
    return {}


@command("rolesInfo")
def roles_info(ctx: AuthContext) -> dict[str, Any]:
    return {"roles": ctx.server.access.roles_info(ctx.db, ctx.cmd.get("rolesInfo"))}


HANDLERS = {
    "saslStart": sasl_start, "saslContinue": sasl_continue, "logout": logout, "connectionStatus": connection_status,
    "createUser": create_user, "updateUser": update_user, "dropUser": drop_user,
    "dropAllUsersFromDatabase": drop_all_users, "grantRolesToUser": grant_roles, "revokeRolesFromUser": grant_roles,
    "usersInfo": users_info, "createRole": create_role, "dropRole": drop_role, "rolesInfo": roles_info,
}  # fmt: skip
