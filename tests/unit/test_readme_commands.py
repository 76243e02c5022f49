"""README.md's and docs/*.md's shell blocks, read as text: no command runs outside the venv,
the marked blocks a test runs are there, and README's test command is what .ci/run runs.

What this proves: every ```bash block of README.md and docs/*.md calls pip, python, ferry,
serve, ray, locust and pytest through ``.venv/bin/`` (or activates the venv first in the same
block), so a reader who pastes a block does not reach the system Python; README keeps the
blocks tests/integration/test_01_readme.py runs; .ci/run runs README's test command, part by
part, in order. What it does not: that any block works -- test_01_readme runs README's marked
blocks; the docs' blocks (GPU, cluster, Kubernetes) are not run anywhere on the CPU.
"""

from __future__ import annotations

import glob
import os

import pytest

from tests.readme_blocks import ROOT, bare_commands, blocks, commands, marked

README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


@pytest.mark.parametrize("path", [README, *DOCS], ids=os.path.basename)
def test_no_shell_block_runs_a_venv_program_from_path(path):
    bare = [
        (b.line, cmd) for b in blocks(path) if b.lang == "bash" for cmd in bare_commands(b.text)
    ]
    assert not bare, f"{os.path.relpath(path, ROOT)}: run these as .venv/bin/...: {bare}"


def test_bare_commands_finds_what_a_reader_would_run_outside_the_venv():
    text = "python3 -m venv .venv\npip install -e '.[torch]'  # the system's\nFOO=1 serve run x"
    assert bare_commands(text) == ["pip install -e '.[torch]'", "FOO=1 serve run x"]
    assert bare_commands("source .venv/bin/activate\npip install -e .\nferry models") == []
    assert bare_commands(".venv/bin/pip install -e . && .venv/bin/ferry models") == []
    assert bare_commands("curl -s x | python -m json.tool") == ["python -m json.tool"]
    # a quoted command runs elsewhere (on a cluster node; Python code): not the block's
    remote = ".venv/bin/ray exec c.yaml 'cd ~/ferry && serve deploy x.yaml'  # there"
    assert bare_commands(remote) == [] and commands(remote) == [remote.split("  #")[0]]
    assert commands('.venv/bin/python -c "a = 1; b = 2 # no comment" && pip x') == [
        '.venv/bin/python -c "a = 1; b = 2 # no comment"',
        "pip x",
    ]


def test_readme_marks_the_main_command_a_request_and_the_test_command():
    (serve,) = marked(README, "serve")
    assert serve.arg == "http://127.0.0.1:8000"
    assert serve.text.endswith(".venv/bin/serve run serve_config.yaml")
    assert serve.text.startswith("python3 -m venv .venv && ")  # it sets the venv up itself
    assert marked(README, "request") and marked(README, "run")
    assert all(b.lang == "bash" for b in blocks(README) if b.kind)


def test_ci_run_runs_readmes_test_command_part_by_part():
    (block,) = marked(README, ".ci/run")
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = commands(f.read())
    parts = commands(block.text)
    assert parts[0] == "python3 -m venv .venv" and parts[-1].startswith(
        ".venv/bin/python -m pytest"
    )
    at = [ci.index(p) for p in parts]  # each part is a command of .ci/run ...
    assert at == sorted(at)  # ... in the same order
