"""Subcommands imported and built when first looked up, not at every start.

typer builds a click command for every registered function before it parses the command
line; for ``qparity show`` that meant importing the modules of ten commands it never runs
and building their parameters (~10 ms of a ~0.3 s start, bench/cli.py). The commands
listed in a :class:`LazyCommands` table are known by name from the start (``--help``,
"Did you mean" suggestions and ``group.commands`` list all of them, in table order after
the commands registered on the app), but a command's module is imported and its click
command built only when that name is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

from typer.core import TyperGroup
from typer.main import get_command_from_info
from typer.models import CommandInfo

LazyTable = dict[str, tuple[str, str]]
"""Command name -> (module, function) of a command built on first use."""


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands by name: the built ones, then the ``lazy`` ones, each built on
    first access by ``build(name, function)``."""

    def __init__(self, built: dict[str, Any], lazy: LazyTable, build) -> None:
        self._built = dict(built)
        self._lazy = {k: v for k, v in lazy.items() if k not in self._built}
        self._order = [*self._built, *self._lazy]
        self._build = build

    def __getitem__(self, name: str) -> Any:
        if name not in self._built and name in self._lazy:
            module, function = self._lazy[name]
            self._built[name] = self._build(
                name, getattr(importlib.import_module(module), function)
            )
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._order:
            self._order.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._built.pop(name, None)
        self._lazy.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order


def lazy_group(lazy: LazyTable, *, pretty_exceptions_short: bool) -> type[TyperGroup]:
    """A TyperGroup class (``typer.Typer(cls=...)``) whose commands are the app's own
    plus those of ``lazy``, built as typer builds a registered command."""

    class LazyGroup(TyperGroup):
        def __init__(self, *, commands: dict[str, Any] | None = None, **attrs: Any) -> None:
            super().__init__(**attrs)
            self.commands = LazyCommands(commands or {}, lazy, self._build_command)

        def _build_command(self, name: str, function) -> Any:
            info = CommandInfo(name=name, callback=function)
            return get_command_from_info(
                info,
                pretty_exceptions_short=pretty_exceptions_short,
                rich_markup_mode=self.rich_markup_mode,
            )

        def list_commands(self, ctx) -> list[str]:
            return list(self.commands)  # names only: listing builds nothing

    return LazyGroup
