"""Optional dependencies: which extra brings which package, and one import that says so.

ProfileDNN installs into the environment where the user already trains, so its hard
dependencies stay small. The built-in model zoo (torchvision's classifiers and RetinaNet,
scikit-learn's digits) sits behind ``pip install 'profilednn[zoo]'``; the code that needs
it imports it through :func:`import_optional`, which turns a missing package into a
:class:`~profilednn.errors.MissingExtraError` whose message is the one line to act on.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from .errors import MissingExtraError

# import name -> (distribution name, the extra that installs it)
OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    "torchvision": ("torchvision", "zoo"),
    "sklearn": ("scikit-learn", "zoo"),
}


def missing_extra_message(package: str, needed_for: str | None = None) -> str:
    """The one-line message for a missing optional ``package`` (its import name)."""
    distribution, extra = OPTIONAL_PACKAGES[package]
    what = needed_for or "this"
    return (
        f"{what} needs {distribution}, which is not installed: "
        f"pip install 'profilednn[{extra}]' (or pip install {distribution})"
    )


def import_optional(module: str, needed_for: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"torchvision.ops"``) from an optional package.

    Raises MissingExtraError naming the extra when the package itself is absent; any
    other import failure (a broken install, a version clash) propagates unchanged.
    """
    package = module.split(".")[0]
    if package not in OPTIONAL_PACKAGES:
        raise ValueError(f"{package!r} is not one of ProfileDNN's optional packages")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != package:
            raise
        raise MissingExtraError(missing_extra_message(package, needed_for)) from exc


def loaded_attribute(module: str, name: str) -> Any:
    """``module.name`` when this process has already imported ``module`` (an optional
    package's), else None. An object of torchvision's (its ``FrozenBatchNorm2d``, its
    ``sigmoid_focal_loss``) can be in a model or a loss only once torchvision is loaded, so
    asking needs no import: importing torchvision takes about a second and would run in the
    user's process and in every optimize arm, whether the script uses it or not."""
    if module.split(".")[0] not in OPTIONAL_PACKAGES:
        raise ValueError(f"{module!r} is not in one of ProfileDNN's optional packages")
    return getattr(sys.modules.get(module), name, None)


def missing_extra_for(exc: BaseException) -> str | None:
    """The one-line message when ``exc`` is an import failure of an optional package that
    escaped :func:`import_optional` (a module-level import), else None."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        package = exc.name.split(".")[0]
        if package in OPTIONAL_PACKAGES:
            return missing_extra_message(package)
    return None


def has_optional(package: str) -> bool:
    """True when optional ``package`` (an import name) can be imported here."""
    return importlib.util.find_spec(package) is not None


__all__ = [
    "OPTIONAL_PACKAGES",
    "has_optional",
    "import_optional",
    "missing_extra_for",
    "missing_extra_message",
]
