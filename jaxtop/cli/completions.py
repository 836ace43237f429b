"""``jaxtop completions SHELL``: a completion script for bash, zsh or fish,
written from the parser itself, so that every command and option it knows
completes (and a new one does without anyone editing a script).

PIDs complete from ``jaxtop ls --pids`` (live agents, no connection made),
files for the commands that take one.
"""

from __future__ import annotations

import argparse

__all__ = ["script"]

#: Commands whose positional argument is a pid of an instrumented process.
PID_COMMANDS = ("attach", "log", "detach", "snapshot")
#: Commands whose positional argument is a file.
FILE_COMMANDS = ("export", "replay", "oom", "run")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(getattr(parser, "commands", {}))


def _options(command: argparse.ArgumentParser) -> list[str]:
    return sorted({o for a in command._actions for o in a.option_strings if o.startswith("--") or len(o) == 2})


def _help(parser: argparse.ArgumentParser) -> dict[str, str]:
    """command -> its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: (a.help or "") for a in action._choices_actions}
    return {}


def bash(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    cases = []
    for name, command in commands.items():
        words = " ".join(_options(command))
        extra = ('COMPREPLY=($(compgen -W "$(jaxtop ls --pids 2>/dev/null)" -- "$cur"))' if name in PID_COMMANDS
                 else 'COMPREPLY=($(compgen -f -- "$cur"))' if name in FILE_COMMANDS else "COMPREPLY=()")
        if name == "completions":
            extra = 'COMPREPLY=($(compgen -W "bash zsh fish" -- "$cur"))'
        # Options for a word that starts with -, else what the command takes.
        cases.append(f'    {name}) if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "{words}" -- "$cur")); '
                     f'else {extra}; fi ;;')
    return "\n".join([
        "# jaxtop completion for bash: eval \"$(jaxtop completions bash)\"",
        "_jaxtop() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" i',
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    [[ "${COMP_WORDS[i]}" != -* ]] && { cmd="${COMP_WORDS[i]}"; break; }',
        "  done",
        '  case "$cmd" in',
        f'    "") COMPREPLY=($(compgen -W "{" ".join(commands)} -h --help -V --version" -- "$cur")) ;;',
        *cases,
        "  esac",
        "}",
        "complete -o default -F _jaxtop jaxtop",
        "",
    ])


def zsh(parser: argparse.ArgumentParser) -> str:
    # zsh runs bash completion functions through bashcompinit.
    return "\n".join([
        "# jaxtop completion for zsh: eval \"$(jaxtop completions zsh)\"",
        "autoload -U +X compinit && compinit",
        "autoload -U +X bashcompinit && bashcompinit",
        bash(parser).split("\n", 1)[1],
    ])


def fish(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    helps = _help(parser)
    lines = ["# jaxtop completion for fish: jaxtop completions fish > ~/.config/fish/completions/jaxtop.fish",
             "complete -c jaxtop -f"]
    for name in commands:
        text = helps.get(name, "").replace("'", "\\'")
        lines.append(f"complete -c jaxtop -n __fish_use_subcommand -a {name} -d '{text}'")
    for name, command in commands.items():
        cond = f"'__fish_seen_subcommand_from {name}'"
        for action in command._actions:
            longs = [o[2:] for o in action.option_strings if o.startswith("--")]
            shorts = [o[1:] for o in action.option_strings if len(o) == 2 and not o.startswith("--")]
            if not longs and not shorts:
                continue
            text = (action.help or "").split(";")[0].replace("'", "\\'")[:80]
            flags = " ".join([f"-l {lo}" for lo in longs] + [f"-s {s}" for s in shorts])
            needs = " -r" if action.nargs != 0 else ""
            lines.append(f"complete -c jaxtop -n {cond} {flags}{needs} -d '{text}'")
        if name in PID_COMMANDS:
            lines.append(f"complete -c jaxtop -n {cond} -a '(jaxtop ls --pids 2>/dev/null)'")
        elif name in FILE_COMMANDS:
            lines.append(f"complete -c jaxtop -n {cond} -F")
        elif name == "completions":
            lines.append(f"complete -c jaxtop -n {cond} -a 'bash zsh fish'")
    return "\n".join(lines) + "\n"


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser)
