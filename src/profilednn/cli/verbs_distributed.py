"""CLI verbs of the distributed job (filled by its module owner)."""

from __future__ import annotations

from .app import app  # noqa: F401
