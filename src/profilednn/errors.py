"""Exceptions users can act on; the CLI turns each into one line and exit code 1."""

from __future__ import annotations


class ProfileDNNError(Exception):
    """Base class: every error ProfileDNN raises on purpose derives from this."""


class InputError(ProfileDNNError):
    """The input (a log, a Run, a file) is unreadable or holds nothing usable."""


class NoPrimitivesError(InputError):
    """A verbose log was read but it holds no oneDNN primitive line."""


class RunError(ProfileDNNError):
    """A Run directory is missing, malformed, or cannot be written."""


class WorkloadError(ProfileDNNError):
    """A workload is unknown or was configured with impossible knobs."""


class MissingExtraError(ProfileDNNError):
    """A feature needs an optional dependency (an extra such as ``profilednn[zoo]``) that is
    not installed; the message names the package and the ``pip install`` that adds it."""


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how a failure shows in a verdict or a note."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
