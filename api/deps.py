"""Typed dependencies: the services built by the app factory, and the caller's identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from api.problems import Problem
from runyard.auth import Principal, authenticate
from runyard.queue import JobQueue
from runyard.settings import Settings
from runyard.tools import ToolRegistry

DEV_TENANT = "dev"


@dataclass
class Services:
    """Everything a request may need, built once per app."""

    settings: Settings
    engine: Engine
    queue: JobQueue
    registry: ToolRegistry


def get_services(request: Request) -> Services:
    """The services of the running app."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(request: Request, services: ServicesDep) -> Principal:
    """Authenticate the Bearer key; with auth disabled everyone is the admin of ``dev``."""
    if services.settings.auth_disabled:
        return Principal(tenant=DEV_TENANT, admin=True)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Problem(
            401,
            "unauthenticated",
            "send an API key as 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = authenticate(services.engine, key.strip())
    if principal is None:
        raise Problem(
            401,
            "invalid_api_key",
            "the API key is unknown or revoked",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
