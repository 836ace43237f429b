"""``jaxtop completions SHELL``: a completion script for bash, zsh or fish,
written from the parser itself, so that every command and option it knows
completes (and a new one does without anyone editing a script).

What each word completes to comes from the parser too: an option's value
from its ``choices`` (``export --format`` → csv, perfetto, ...), a file or a
directory when its metavar names one (``FILE``, ``OUT``, ``DIR``), else
nothing; a positional from its ``choices`` (``serve`` → replay, attach;
``completions`` → bash, zsh, fish), PIDs from ``jaxtop ls --pids`` (live
agents, no connection made), files for the commands that take one.

File names are where a completion script can hurt: bash inserts what the
function returns as it is, so a file named ``n;id>PWNED;.jsonl`` returned
bare runs ``id`` when the line is entered. bash and zsh (which runs the
bash function through bashcompinit) get every name quoted with ``printf
%q``: one word, read back as the name, never run nor split. fish completes
and escapes file names itself.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Union

__all__ = ["script"]

#: Commands whose positional arguments are pids of instrumented processes.
PID_COMMANDS = ("attach", "log", "detach", "snapshot")
#: Commands whose positional arguments are files.
FILE_COMMANDS = ("export", "replay", "oom", "run")
#: A positional that says what the ones after it are: ``serve replay FILE``,
#: ``serve attach PID...``.
SUBJECTS = {"serve": {"replay": "file", "attach": "pid"}}
#: Commands whose arguments after the first positional belong to the
#: program they run, even those that look like options (``run train.py --lr``).
PROGRAM_COMMANDS = ("run",)
#: Metavars of option values that are files, and directories.
FILE_METAVARS = ("FILE", "OUT", "SPEC")
DIR_METAVARS = ("DIR",)

#: What a word completes to: a list of words, or "file", "dir", "pid", "none".
Kind = Union[list, str]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(getattr(parser, "commands", {}))


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS


def _options(command: argparse.ArgumentParser) -> list[str]:
    return sorted({o for a in command._actions if _shown(a) for o in a.option_strings
                   if o.startswith("--") or len(o) == 2})


def _help(parser: argparse.ArgumentParser) -> dict[str, str]:
    """command -> its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: (a.help or "") for a in action._choices_actions}
    return {}


def _value_kind(action: argparse.Action) -> Kind:
    """What the value of an option completes to."""
    if action.choices:
        return [str(c) for c in action.choices]
    metavar = str(action.metavar or "")
    if metavar in DIR_METAVARS:
        return "dir"
    if metavar in FILE_METAVARS:
        return "file"
    return "none"


def _value_options(command: argparse.ArgumentParser) -> dict[str, Kind]:
    """Every option that takes a value -> what the value completes to."""
    out: dict[str, Kind] = {}
    for action in command._actions:
        if action.option_strings and action.nargs != 0:
            for option in action.option_strings:
                out[option] = _value_kind(action)
    return out


def _positionals(name: str, command: argparse.ArgumentParser) -> list[Kind]:
    """What each positional completes to, in order; the last one repeats."""
    kinds: list[Kind] = []
    for action in command._actions:
        if action.option_strings:
            continue
        if action.choices:
            kinds.append([str(c) for c in action.choices])
        elif getattr(action.type, "__name__", "") == "_pid" or name in PID_COMMANDS:
            kinds.append("pid")
        elif name in FILE_COMMANDS:
            kinds.append("file")
        else:
            kinds.append("none")
    return kinds


# -- bash (and zsh, through bashcompinit) -------------------------------------------

_BASH_HELPERS = r'''_jaxtop_words() {  # the words of $1 that start with the word completed
  local IFS=$' \t\n'
  COMPREPLY=($(compgen -P "$pre" -W "$1" -- "$cur"))
}
_jaxtop_pids() { _jaxtop_words "$(jaxtop ls --pids 2>/dev/null)"; }
_jaxtop_none() {  # nothing to offer (a number, a URL): not even file names
  COMPREPLY=()
  type compopt >/dev/null 2>&1 && compopt +o default 2>/dev/null
  return 0
}
_jaxtop_files() {  # file names (-d: directories), each quoted as the shell reads it back
  local word=$cur f kind=-f
  [[ $1 == -d ]] && kind=-d
  case $word in \'*) word=${word#\'} ;; \"*) word=${word#\"} ;; esac
  word=${word//\\/}
  COMPREPLY=()
  while IFS= read -r f; do
    [[ -z $f ]] && continue
    [[ -d $f && $f != */ ]] && f+=/
    COMPREPLY+=("$pre$(printf '%q' "$f")")
  done < <(compgen $kind -- "$word")
  if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == */ ]]; then
    type compopt >/dev/null 2>&1 && compopt -o nospace 2>/dev/null
  fi
  return 0
}
_jaxtop_count() {  # n: positional words between the command (word $1) and the one completed; first: the first
  local i w skip=0
  n=0 first=""
  for ((i = $1 + 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [[ $w == "=" ]]; then skip=1; continue; fi  # bash splits --opt=value at the =
    if ((skip)); then skip=0; continue; fi
    if [[ $w == -* ]]; then
      [[ $w != *=* && " $2 " == *" $w "* ]] && skip=1
      continue
    fi
    [[ $n -eq 0 ]] && first=$w
    n=$((n + 1))
  done
}'''


def _bash_complete(kind: Kind) -> str:
    """The bash statement that completes ``kind``."""
    if isinstance(kind, list):
        return f"_jaxtop_words {shlex.quote(' '.join(kind))}"
    return {"file": "_jaxtop_files", "dir": "_jaxtop_files -d", "pid": "_jaxtop_pids"}.get(kind, "_jaxtop_none")


def _bash_command(name: str, command: argparse.ArgumentParser) -> list[str]:
    values = _value_options(command)
    lines = [f"    {name})"]
    by_kind: dict[str, list[str]] = {}
    for option, kind in values.items():
        by_kind.setdefault(_bash_complete(kind), []).append(option)
    if by_kind:
        lines.append('      case "$prev" in')
        for statement, options in by_kind.items():
            lines.append(f"        {'|'.join(options)}) {statement}; return ;;")
        lines.append("      esac")
    lines.append(f"      _jaxtop_count \"$i\" {shlex.quote(' '.join(values))}")
    words = shlex.quote(" ".join(_options(command)))
    after_program = " && ((n == 0))" if name in PROGRAM_COMMANDS else ""
    lines.append(f'      if [[ $cur == -* ]]{after_program}; then _jaxtop_words {words}; return; fi')
    kinds = _positionals(name, command)
    cases = [f"        {k}) {_bash_complete(kind)} ;;" for k, kind in enumerate(kinds[:-1])]
    if name in SUBJECTS:
        subjects = " ".join(f"{subject}) {_bash_complete(kind)} ;;" for subject, kind in SUBJECTS[name].items())
        cases.append(f'        *) case "$first" in {subjects} *) _jaxtop_none ;; esac ;;')
    elif kinds:
        cases.append(f"        *) {_bash_complete(kinds[-1])} ;;")
    if cases:
        lines += ['      case "$n" in', *cases, "      esac"]
    else:
        lines.append("      _jaxtop_none")
    lines.append("      ;;")
    return lines


def bash(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    body = []
    for name, command in commands.items():
        body += _bash_command(name, command)
    return "\n".join([
        "# jaxtop completion for bash: eval \"$(jaxtop completions bash)\"",
        _BASH_HELPERS,
        "_jaxtop() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="" pre="" cmd="" i n first',
        '  ((COMP_CWORD > 0)) && prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "  # --opt=value: bash splits it at the = (COMP_WORDBREAKS), zsh does not",
        '  if [[ $cur == "=" ]]; then cur=""',
        '  elif [[ $prev == "=" ]] && ((COMP_CWORD > 1)); then prev="${COMP_WORDS[COMP_CWORD-2]}"',
        '  elif [[ $cur == --*=* ]]; then prev=${cur%%=*}; pre="$prev="; cur=${cur#*=}',
        "  fi",
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    [[ "${COMP_WORDS[i]}" != -* ]] && { cmd="${COMP_WORDS[i]}"; break; }',
        "  done",
        '  case "$cmd" in',
        f'    "") _jaxtop_words {shlex.quote(" ".join([*commands, "-h", "--help", "-V", "--version"]))} ;;',
        *body,
        "  esac",
        "}",
        "complete -o default -F _jaxtop jaxtop",
        "",
    ])


def zsh(parser: argparse.ArgumentParser) -> str:
    # zsh runs bash completion functions through bashcompinit, which unquotes
    # each word the function returns and quotes it again as it inserts it.
    return "\n".join([
        "# jaxtop completion for zsh: eval \"$(jaxtop completions zsh)\"",
        "autoload -U +X compinit && compinit",
        "autoload -U +X bashcompinit && bashcompinit",
        bash(parser).split("\n", 1)[1],
    ])


# -- fish ------------------------------------------------------------------------------

def _fish_text(text: str) -> str:
    """``text`` as one fish word in single quotes."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_values(kind: Kind) -> str:
    """The ``complete`` flags that offer ``kind`` (``-x``: no file names)."""
    if isinstance(kind, list):
        return f"-x -a {_fish_text(' '.join(kind))}"
    return {"file": "-r -F", "dir": "-x -a '(__fish_complete_directories)'",
            "pid": "-x -a '(jaxtop ls --pids 2>/dev/null)'"}.get(kind, "-x")


def _fish_positional(kind: Kind) -> str:
    """The ``complete`` flags that offer ``kind`` as a positional argument."""
    if isinstance(kind, list):
        return f"-a {_fish_text(' '.join(kind))}"
    return {"file": "-F", "dir": "-a '(__fish_complete_directories)'",
            "pid": "-a '(jaxtop ls --pids 2>/dev/null)'"}.get(kind, "")


def fish(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    helps = _help(parser)
    lines = ["# jaxtop completion for fish: jaxtop completions fish > ~/.config/fish/completions/jaxtop.fish",
             "complete -c jaxtop -f"]
    for name in commands:
        lines.append(f"complete -c jaxtop -n __fish_use_subcommand -a {name} -d {_fish_text(helps.get(name, ''))}")
    for name, command in commands.items():
        cond = f"'__fish_seen_subcommand_from {name}'"
        for action in command._actions:
            longs = [o[2:] for o in action.option_strings if o.startswith("--")]
            shorts = [o[1:] for o in action.option_strings if len(o) == 2 and not o.startswith("--")]
            if not (longs or shorts) or not _shown(action):
                continue
            text = _fish_text((action.help or "").split(";")[0][:80])
            flags = " ".join([f"-l {lo}" for lo in longs] + [f"-s {s}" for s in shorts])
            values = f" {_fish_values(_value_kind(action))}" if action.nargs != 0 else ""
            lines.append(f"complete -c jaxtop -n {cond} {flags}{values} -d {text}")
        kinds = _positionals(name, command)
        if name in SUBJECTS:
            subjects = " ".join(SUBJECTS[name])
            lines.append(f"complete -c jaxtop -n '__fish_seen_subcommand_from {name}; and not "
                         f"__fish_seen_subcommand_from {subjects}' -a {_fish_text(subjects)}")
            for subject, kind in SUBJECTS[name].items():
                lines.append(f"complete -c jaxtop -n '__fish_seen_subcommand_from {name}; and "
                             f"__fish_seen_subcommand_from {subject}' {_fish_positional(kind)}")
        elif kinds and _fish_positional(kinds[0]):
            lines.append(f"complete -c jaxtop -n {cond} {_fish_positional(kinds[0])}")
    return "\n".join(lines) + "\n"


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser)
