"""The MCP server at ``/mcp``: runyard's tools for agents, over the official SDK's streamable
HTTP transport. ``install_mcp`` mounts it; every call is a durable run (docs/mcp.md)."""

from __future__ import annotations

from api.mcp.mount import install_mcp

__all__ = ["install_mcp"]
