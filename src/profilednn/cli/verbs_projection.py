"""CLI verbs of the projection job (filled by its module owner)."""

from __future__ import annotations

from .app import app  # noqa: F401
