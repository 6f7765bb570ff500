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
SCRIPT = "script"


def option(default: Any = dataclasses.MISSING, *, help: str, flags: tuple[str, ...] = (),
           default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
           script: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its ``help`` (the CLI option's help) and, where the option is
    not simply ``--field-name``, its ``flags`` (e.g. ``("--headroom/--no-headroom",)``).
    ``script``: the field's default where the settings measure a user's script rather than
    a built-in setup (``optimize -- python train.py``), when that differs."""
    metadata = {HELP: help, FLAGS: tuple(flags)}
    if script is not dataclasses.MISSING:
        metadata[SCRIPT] = script
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


def script_defaults(cls: type) -> dict[str, Any]:
    """The fields of ``cls`` whose default differs for a script, with that default."""
    return {f.name: f.metadata[SCRIPT] for f in dataclasses.fields(cls) if SCRIPT in f.metadata}


def field_help(cls: type, name: str) -> str | None:
    """The help of ``cls``'s field ``name`` (None when it was not declared with ``option``);
    a field with a script default says both defaults (``default 5; a script: 2``)."""
    f = settings_field(cls, name)
    text = f.metadata.get(HELP)
    if text is None or SCRIPT not in f.metadata:
        return text
    return f"{text.rstrip('.')} (default {field_default(cls, name)}; a script: {f.metadata[SCRIPT]})."


def field_flags(cls: type, name: str) -> tuple[str, ...]:
    """The option flags of ``cls``'s field ``name`` (empty: ``--name`` with dashes)."""
    return tuple(settings_field(cls, name).metadata.get(FLAGS, ()))


__all__ = ["field_default", "field_flags", "field_help", "option", "script_defaults", "settings_field"]
