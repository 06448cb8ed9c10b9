"""Typer options that several commands take, each defined once: a command declares a group, and its
function receives the group's values in one dict instead of a parameter per option."""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable, TypeVar

from typer.models import OptionInfo

F = TypeVar("F", bound=Callable[..., Any])


class OptionGroup:
    """Named options, each an annotation and its `typer.Option`; `group.into("name")` decorates a command."""

    def __init__(self, **options: tuple[Any, OptionInfo]) -> None:
        self.options = options

    def __or__(self, other: OptionGroup) -> OptionGroup:
        return OptionGroup(**self.options, **other.options)

    def only(self, *names: str, **helps: str) -> OptionGroup:
        """The named options of this group, defined here once; `helps` restates an option's help where
        another command gives it a meaning of its own."""
        picked: dict[str, tuple[Any, OptionInfo]] = {}
        for name in names:
            annotation, info = self.options[name]
            if name in helps:
                info = copy.copy(info)
                info.help = helps[name]
            picked[name] = (annotation, info)
        return OptionGroup(**picked)

    def into(self, parameter: str) -> Callable[[F], F]:
        """Add the group's options to the command's signature (after its own); the command gets their
        values as the dict `parameter`. Typer reads the new signature, so `--help` lists every option."""

        def decorate(command: F) -> F:
            signature = inspect.signature(command)
            own = [p for p in signature.parameters.values() if p.name != parameter]
            clash = {p.name for p in own} & set(self.options)
            if clash:
                raise TypeError(f"{command.__name__} defines {sorted(clash)} itself and through its option group")
            added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
                     for name, (annotation, info) in self.options.items()]

            @functools.wraps(command)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                values = {name: kwargs.pop(name) for name in self.options}
                return command(*args, **kwargs, **{parameter: values})

            wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
            return wrapper  # type: ignore[return-value]

        return decorate
