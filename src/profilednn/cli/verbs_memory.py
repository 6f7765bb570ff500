"""CLI verbs of the memory job (filled by its module owner)."""

from __future__ import annotations

from .app import app  # noqa: F401
