"""A process's start: its tracing (`switch`) and its log lines' trace ids (`logs`)."""

from __future__ import annotations

import logging

from gateway.config.sections import TracingSettings
from gateway.tracing.logs import install
from gateway.tracing.switch import configure, protocol

log = logging.getLogger("batchyard.tracing")


def start_process(role: str, settings: TracingSettings | None = None) -> bool:
    """Set tracing up for this process's `role` (True when on) and put trace ids in its log lines; call it
    once logging is set up."""
    on = configure(role, settings)
    install()
    if on:
        log.info("traces on: role %s, OTLP %s", role, protocol())
    return on


__all__ = ["start_process"]
