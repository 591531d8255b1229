"""The cli_* modules' commands are known by name from the start and built on first look-up."""

from __future__ import annotations

import typer

from qparity import cli
from qparity.cli_lazy import LazyCommands


def _commands(built: list[str]) -> LazyCommands:
    """``json.dumps``, ``json.loads`` as lazy commands after an eager one; ``built`` records
    each build."""
    lazy = {"dumps": ("json", "dumps"), "loads": ("json", "loads")}
    return LazyCommands({"run": "RUN"}, lazy, lambda name, fn: built.append(name) or fn)


def test_names_are_listed_without_building_anything():
    built: list[str] = []
    commands = _commands(built)
    assert list(commands) == ["run", "dumps", "loads"]
    assert "loads" in commands and len(commands) == 3 and "nope" not in commands
    assert built == []


def test_a_look_up_builds_only_that_command_once():
    import json

    built: list[str] = []
    commands = _commands(built)
    assert commands["loads"] is json.loads and commands.get("loads") is json.loads
    assert commands.get("nope") is None
    assert built == ["loads"]
    assert dict(commands) == {"run": "RUN", "dumps": json.dumps, "loads": json.loads}
    assert built == ["loads", "dumps"]


def test_the_app_lists_every_command_in_registration_order():
    group = typer.main.get_command(cli.app)
    own = ["run", "demo", "runs", "show", "localize", "rerun"]
    assert group.list_commands(None) == own + list(cli.LAZY_COMMANDS)
    assert group.get_command(None, "sql").name == "sql"
    assert group.get_command(None, "sql").callback is not None
