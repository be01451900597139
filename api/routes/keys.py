"""API keys for admins: list, create (the secret shown once), revoke."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from api.deps import PrincipalDep, ServicesDep
from api.openapi import BODY_ERRORS, COMMON_ERRORS, problem
from api.problems import Problem
from api.schemas import KeyCreate, KeyCreated, KeyOut, KeyUpdate
from runyard.tenancy.auth import Principal, issue_api_key
from runyard.tenancy.keys import PREFIX_PATTERN, list_keys, revoke_key
from runyard.tenancy.keys import update_key as change_key

logger = logging.getLogger(__name__)

FORBIDDEN = problem("Only an admin key may manage keys")
MAX_KEYS = 1000


async def admin_principal(principal: PrincipalDep) -> Principal:
    """The caller, if it holds an admin key; 403 otherwise."""
    if not principal.admin:
        raise Problem(403, "forbidden", "managing API keys needs an admin key")
    return principal


AdminDep = Annotated[Principal, Depends(admin_principal)]
router = APIRouter(prefix="/v1/keys", tags=["keys"], responses={**COMMON_ERRORS, 403: FORBIDDEN})


@router.get("", operation_id="listKeys")
def get_keys(
    services: ServicesDep,
    admin: AdminDep,
    tenant: Annotated[
        str | None, Query(min_length=1, max_length=128, description="Only this tenant's keys")
    ] = None,
    include_revoked: Annotated[bool, Query(description="Revoked keys too")] = False,
    limit: Annotated[int, Query(ge=1, le=MAX_KEYS, description="At most this many")] = 200,
) -> list[KeyOut]:
    """Keys newest first, live ones unless ``include_revoked``; never a secret or hash."""
    keys = list_keys(services.engine, tenant=tenant, include_revoked=include_revoked, limit=limit)
    return [KeyOut.model_validate(key, from_attributes=True) for key in keys]


@router.post("", operation_id="createKey", status_code=201, responses={**BODY_ERRORS})
def create_key(body: KeyCreate, services: ServicesDep, admin: AdminDep) -> KeyCreated:
    """Create a key; the answer is the only place its secret ever appears."""
    issued = issue_api_key(
        services.engine,
        body.tenant,
        admin=body.admin,
        name=body.name,
        max_priority=body.max_priority,
        tools=body.tools,
    )
    logger.info(
        "api key created",
        extra={"key": issued.prefix, "tenant": issued.tenant, "by": admin.key_prefix},
    )
    return KeyCreated(
        key=issued.key,
        prefix=issued.prefix,
        tenant=issued.tenant,
        name=issued.name,
        scopes=issued.scopes,
        max_priority=issued.max_priority,
        tools=issued.tools,
        created_at=issued.created_at,
        last_used_at=None,
        revoked_at=None,
    )


@router.delete(
    "/{prefix}",
    operation_id="revokeKey",
    status_code=204,
    response_class=Response,
    responses={404: problem("There is no key with this prefix")},
)
def delete_key(
    prefix: Annotated[str, Path(description="The key's prefix (GET /v1/keys)")],
    services: ServicesDep,
    admin: AdminDep,
) -> Response:
    """Revoke a key (again is fine): this process refuses it at once, others within
    the auth cache's few seconds."""
    revoked = revoke_key(services.engine, prefix) if _well_formed(prefix) else None
    if revoked is None:
        raise Problem(404, "key_not_found", f"there is no key {prefix!r}")
    services.auth_cache.forget(prefix)
    logger.info("api key revoked", extra={"key": prefix, "by": admin.key_prefix})
    return Response(status_code=204)


@router.patch(
    "/{prefix}",
    operation_id="updateKey",
    responses={**BODY_ERRORS, 404: problem("There is no key with this prefix")},
)
def update_key(
    prefix: Annotated[str, Path(description="The key's prefix (GET /v1/keys)")],
    body: KeyUpdate,
    services: ServicesDep,
    admin: AdminDep,
) -> KeyOut:
    """Change a key's highest priority or the tools it may run; this process applies it at
    once, others within the auth cache's few seconds."""
    key = (
        change_key(
            services.engine,
            prefix,
            max_priority=body.max_priority,
            tools=body.tools,
            all_tools=body.all_tools,
        )
        if _well_formed(prefix)
        else None
    )
    if key is None:
        raise Problem(404, "key_not_found", f"there is no key {prefix!r}")
    services.auth_cache.forget(prefix)
    logger.info(
        "api key changed",
        extra={
            "key": prefix,
            "max_priority": body.max_priority,
            "tools": body.tools,
            "all_tools": body.all_tools,
            "by": admin.key_prefix,
        },
    )
    return KeyOut.model_validate(key, from_attributes=True)


def _well_formed(prefix: str) -> bool:
    return PREFIX_PATTERN.fullmatch(prefix) is not None
