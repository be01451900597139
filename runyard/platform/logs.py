"""Log configuration for entry points only: text for people, JSON for machines."""

from __future__ import annotations

import json
import logging
import logging.config
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with every ``extra`` field at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    """A plain line with the structured fields appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Install one stderr handler on the root logger."""
    formatter = "json" if fmt == "json" else "text"
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "json": {"()": JsonFormatter},
                "text": {
                    "()": TextFormatter,
                    "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
                },
            },
            "handlers": {
                "stderr": {"class": "logging.StreamHandler", "formatter": formatter},
            },
            "root": {"level": level.upper(), "handlers": ["stderr"]},
            "loggers": {
                "uvicorn.access": {"level": "WARNING"},
                "alembic": {"level": "WARNING"},
            },
        }
    )
