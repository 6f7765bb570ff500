"""CLI verbs (registered on the shared typer app)."""

from __future__ import annotations

from .app import app  # noqa: F401
