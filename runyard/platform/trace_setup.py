"""Tracing as the environment asks for it: the one call of an entry point, which sets up the
OpenTelemetry adapter only when the standard ``OTEL_*`` variables name an exporter (else
nothing of the SDK is imported)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from runyard.platform.tracing import NO_TRACING, Tracing, install

logger = logging.getLogger(__name__)


def wanted(env: Mapping[str, str]) -> str | None:
    """The exporter the ``OTEL_*`` variables ask for (``otlp`` or ``console``), or None:
    tracing stays off unless an exporter or an OTLP endpoint is named."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter in ("otlp", "console"):
        return exporter
    if exporter:
        return None  # "none", or an exporter this build has not
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return "otlp" if any(env.get(name) for name in endpoints) else None


def from_env(service_name: str, env: Mapping[str, str] | None = None) -> Tracing:
    """The tracing an entry point sets up: ``OtelTracing`` when the environment names an
    exporter, else ``NO_TRACING`` (no SDK set up at all)."""
    env = os.environ if env is None else env
    exporter_name = wanted(env)
    if exporter_name is None:
        return NO_TRACING
    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter: Any = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    from runyard.platform.otel import OtelTracing

    logger.info("traces exported", extra={"exporter": exporter_name, "service": service_name})
    return OtelTracing(service_name, exporter)


def set_up(service_name: str) -> Tracing:
    """An entry point's one call: the tracing the environment asks for, installed."""
    configured = from_env(service_name)
    install(configured)
    return configured
