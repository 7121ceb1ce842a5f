"""The HTTP front door: OpenAI's Files and Batches API (and Azure's forms of it) over the runtime."""

from gateway.server.app import create_app

__all__ = ["create_app"]
