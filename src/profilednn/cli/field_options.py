"""CLI options built from a settings dataclass's fields (``option_fields.py``).

A verb marks a parameter ``= FROM_FIELD`` and is decorated with ``@options_from(Settings)``:
the parameter then becomes a typer option with the default, help and flags of the field
of the same name. A field with a script default (``option(..., script=...)``) becomes an
option that defaults to None (not given), its help stating both defaults. A parameter
already annotated with a shared option (``ImageSize``, ``RunsDir``, ...) keeps that option
and takes only the field's default.

    @app.command("optimize")
    @options_from(Settings)
    def optimize_cmd(..., rounds: int = FROM_FIELD, ...) -> None:
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Callable, Optional, TypeVar, get_args, get_origin

import typer
from typer.models import OptionInfo

from ..option_fields import field_default, field_flags, field_help, script_defaults

F = TypeVar("F", bound=Callable[..., Any])


class _FromField:
    def __repr__(self) -> str:
        return "FROM_FIELD"


FROM_FIELD: Any = _FromField()  # "this option's default and help are the field's"


def _has_option(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and any(isinstance(a, OptionInfo) for a in get_args(annotation)[1:])


def _lone_flag(annotation: Any, flags: tuple[str, ...]) -> bool:
    """A bool option given as one flag (``--capture``, ``--no-comm``): its presence is the value."""
    return annotation is bool and len(flags) == 1 and "/" not in flags[0]


def _field_parameter(cls: type, param: inspect.Parameter) -> tuple[inspect.Parameter, bool]:
    """The typer parameter for ``cls``'s field ``param.name``, and whether it is the field's
    negation (a True field turned off by a flag such as ``--no-comm``: the parameter is then
    named after the flag, defaults to False, and the verb receives the field's value)."""
    annotation, default = param.annotation, field_default(cls, param.name)
    if _has_option(annotation):
        return param.replace(default=default), False
    flags, name = field_flags(cls, param.name), param.name
    if param.name in script_defaults(cls):  # two defaults: None says "not given", the help says both
        info = typer.Option(*flags, help=field_help(cls, param.name), show_default=False)
        return param.replace(annotation=Annotated[Optional[annotation], info], default=None), False
    lone = _lone_flag(annotation, flags)
    negated = lone and default is True
    if negated:
        name, default = flags[0].lstrip("-").replace("-", "_"), False
    info = typer.Option(*flags, help=field_help(cls, param.name), show_default=not lone)
    return param.replace(name=name, annotation=Annotated[annotation, info], default=default), negated


def options_from(cls: type) -> Callable[[F], F]:
    """Give each ``FROM_FIELD`` parameter of a typer verb the option of ``cls``'s field of
    the same name (a ``TypeError`` at import when there is no such field)."""

    def wrap(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        params, negated = [], {}  # negated: the flag's parameter -> the field it turns off
        for p in signature.parameters.values():
            if p.default is FROM_FIELD:
                q, flips = _field_parameter(cls, p)
                negated.update({q.name: p.name} if flips else {})
                p = q
            params.append(p)
        built = signature.replace(parameters=params)
        if not negated:
            func.__signature__ = built  # type: ignore[attr-defined]
            return func

        @functools.wraps(func)
        def verb(**kwargs: Any) -> Any:  # typer passes the flags; the verb takes the fields
            for flag, field in negated.items():
                kwargs[field] = not kwargs.pop(flag)
            return func(**kwargs)

        verb.__signature__ = built  # type: ignore[attr-defined]
        return verb  # type: ignore[return-value]

    return wrap


__all__ = ["FROM_FIELD", "options_from"]
