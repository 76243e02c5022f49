"""The shell blocks of README.md (and docs/*.md) that a test runs or checks.

A block is marked by an HTML comment on the line before its fence, which a reader of the
rendered page does not see:

    <!-- ci: serve http://127.0.0.1:8000 -->   the long-running service: started, probed, stopped
    <!-- ci: request -->                        run while that service answers; must exit 0
    <!-- ci: run -->                            run to its end; must exit 0
    <!-- ci: .ci/run -->                        the test command: .ci/run must run exactly it

``bare_commands`` finds, in every ```bash block, a command that would run outside the venv.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"^<!--\s*ci:\s*(\S+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
# programs the venv provides: run bare, they are whatever the shell finds first (the system
# Python's pip, or nothing), not the venv's
VENV_PROGRAMS = ("pip", "pip3", "python", "python3", "ferry", "serve", "ray", "locust", "pytest")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text, the marker before it (kind, argument; ``""``
    when unmarked) and the line its fence opens on (1-based)."""

    lang: str
    text: str
    kind: str
    arg: str
    line: int


def blocks(path: str) -> list[Block]:
    """Every fenced block of a Markdown file, with the ``ci:`` marker before it, if any."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, i, mark = [], 0, ("", "")
    while i < len(lines):
        m, fence = MARK.match(lines[i]), FENCE.match(lines[i])
        if m:
            mark = (m.group(1), m.group(2))
        elif fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            assert end is not None, f"{path}:{i + 1}: a fence that never closes"
            out.append(Block(fence.group(1), "\n".join(lines[i + 1 : end]), *mark, i + 1))
            mark, i = ("", ""), end
        elif lines[i].strip():
            mark = ("", "")  # a marker applies to the fence right after it (blank lines aside)
        i += 1
    return out


def marked(path: str, kind: str) -> list[Block]:
    return [b for b in blocks(path) if b.kind == kind]


def commands(text: str) -> list[str]:
    """The commands of a shell block: its lines with continuations joined and comments
    dropped, each split at ``&&``, ``||``, ``;`` and ``|``. A quoted argument is one word,
    ``'...'`` or ``"..."`` as written (what runs inside it -- ``python -c`` code, the command
    ``ray exec`` runs on a cluster node -- is not a command of the block)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        quoted = QUOTED.findall(line)
        for part in re.split(r"&&|\|\||;|\|", QUOTED.sub("\0", line)):
            part = part.split(" #", 1)[0].strip()
            while "\0" in part:
                part = part.replace("\0", quoted.pop(0), 1)
            if part:
                out.append(part)
    return out


def program(command: str) -> str:
    """The program a command runs: its first word after ``VAR=value`` assignments."""
    words = command.split()
    while words and ENV_ASSIGN.match(words[0]):
        words = words[1:]
    return words[0] if words else ""


def bare_commands(text: str) -> list[str]:
    """The commands of a ``bash`` block that would run a venv program from PATH: ``pip``,
    ``python``, ``ferry``, ``serve``... without ``.venv/bin/``, unless the block activates the
    venv (``source .venv/bin/activate``) before them. ``python3 -m venv`` (making the venv) is
    the one bare command allowed."""
    out, active = [], False
    for cmd in commands(text):
        prog = program(cmd)
        if prog in ("source", ".") and cmd.split()[-1].endswith(".venv/bin/activate"):
            active = True
        elif prog in VENV_PROGRAMS and not active and cmd.split()[1:3] != ["-m", "venv"]:
            out.append(cmd)
    return out
