"""Check that a command line written in a config file names something this project has.

The CI workflow and the compose file run commands nobody executes on a development
machine (no Docker engine, no hosted runner). A renamed subcommand or a dropped flag
would surface only on a hosted run or a user's `docker compose up`; these checks make
it surface here. ``effect-broker`` and ``manage.py`` lines are parsed by the command's
own argument parser, so an unknown subcommand or option fails the test.
"""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

from django.core.management import CommandError, get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]

#: Programs that come from the host or the image, not from this project.
EXTERNAL = {"docker", "sudo", "apt-get", "sh", "pg_isready", "test", "cd"}
#: Console scripts of the dev extra (pyproject.toml) that a line may call directly.
DEV_TOOLS = {"ruff", "mypy", "pytest"}


def split_commands(line: str) -> list[list[str]]:
    """One shell line into its simple commands (split on &&, ||, ; and |)."""
    commands: list[list[str]] = [[]]
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    for token in lexer:
        if token in {"&&", "||", ";", "|"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def check_line(line: str) -> None:
    """Check every simple command of one shell line."""
    for argv in split_commands(line):
        check_command(argv)


def check_command(argv: list[str]) -> None:
    """Raise AssertionError when ``argv`` names a command or option we lack."""
    program, *args = argv
    if program in EXTERNAL:
        return
    if program in {"python", "python3"}:
        _check_python(args)
    elif program == "effect-broker":
        check_management_command(args)
    elif program in DEV_TOOLS:
        if program == "pytest":
            for arg in args:
                if not arg.startswith("-"):
                    assert (ROOT / arg.split("::")[0]).exists(), f"pytest path {arg}"
    elif program.startswith((".", "/")) or "/" in program:
        assert (ROOT / program).exists(), f"{program} does not exist"
    else:
        raise AssertionError(f"unknown program {program!r} in {shlex.join(argv)}")


def _check_python(args: list[str]) -> None:
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]
        if module == "pip":
            return
        if module == "effect_broker.cli":
            check_management_command(rest)
            return
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        return
    if args[:1] == ["manage.py"]:
        check_management_command(args[1:])
        return
    if args[:1] == ["-c"]:
        compile(args[1], "<python -c>", "exec")
        return
    raise AssertionError(f"unrecognised python invocation: {args}")


def check_management_command(args: list[str]) -> None:
    """The management command exists and its parser accepts these arguments."""
    assert args, "effect-broker with no subcommand"
    if args[0] in {"--help", "-h", "help"}:
        return
    name = args[0]
    # --help exits from argparse; what matters is that the command path before it exists.
    rest = [arg for arg in args[1:] if arg not in {"--help", "-h"}]
    commands = get_commands()
    assert name in commands, f"effect-broker has no command {name!r}"
    command = load_command_class(commands[name], name)
    parser = command.create_parser("effect-broker", name)
    # Django's parser raises CommandError (argparse alone would exit) on an unknown
    # option; either becomes a readable failure.
    try:
        parser.parse_args(rest)
    except (CommandError, SystemExit) as exc:
        raise AssertionError(f"effect-broker {shlex.join(args)} is refused") from exc
