"""Settings as data: a dataclass field that is also a command-line option.

A settings dataclass (``optimization.Settings``, ``distributed.TrainConfig``) declares
each field's default and help once, with ``option(...)``; the CLI builds its options from
those fields (``cli/field_options.py``), so the two can never say different things.
Torch-free and typer-free: the CLI reads these fields while it starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

HELP = "help"  # the field's metadata keys
FLAGS = "flags"


def option(default: Any = dataclasses.MISSING, *, help: str, flags: tuple[str, ...] = (),
           default_factory: Callable[[], Any] | Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its ``help`` (the CLI option's help) and, where the option is
    not simply ``--field-name``, its ``flags`` (e.g. ``("--headroom/--no-headroom",)``)."""
    metadata = {HELP: help, FLAGS: tuple(flags)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def settings_field(cls: type, name: str) -> dataclasses.Field:
    """The field ``name`` of the dataclass ``cls`` (a ``TypeError`` naming the fields if none)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise TypeError(f"{cls.__name__} has no field {name!r}; its fields are {', '.join(fields)}")
    return fields[name]


def field_default(cls: type, name: str) -> Any:
    """The default of ``cls``'s field ``name`` (a fresh one for a ``default_factory``)."""
    f = settings_field(cls, name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    if f.default is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{name} has no default")
    return f.default


def field_help(cls: type, name: str) -> str | None:
    """The help of ``cls``'s field ``name`` (None when it was not declared with ``option``)."""
    return settings_field(cls, name).metadata.get(HELP)


def field_flags(cls: type, name: str) -> tuple[str, ...]:
    """The option flags of ``cls``'s field ``name`` (empty: ``--name`` with dashes)."""
    return tuple(settings_field(cls, name).metadata.get(FLAGS, ()))


__all__ = ["field_default", "field_flags", "field_help", "option", "settings_field"]
