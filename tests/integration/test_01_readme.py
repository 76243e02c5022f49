"""README's first screens, run as written, in a fresh venv over a copy of this checkout.

The blocks are the README's own, marked by an HTML comment before their fence
(``tests/readme_blocks.py``): ``ci: serve URL`` (the main command: it makes ``.venv``,
installs Ferry into it and starts ``serve run``), ``ci: request`` (run while it answers),
``ci: run`` (run after it has stopped). Each runs in ``bash -e`` from the copy's root, so
every command of a block must exit 0.

What this proves:
* the main command, character for character, makes a venv, installs Ferry into it with the
  venv's pip and brings the embedded CPU default up on README's URL (readiness 200);
* README's request blocks get the answers README shows: the PNG it makes is classified "1"
  by digits, readiness is ready, and digits' metadata names its UINT8 input "image";
* the ``ci: run`` blocks (``ferry config check``, ``ferry models``) exit 0 from that venv;
* they need nothing outside the venv: the copy has no ``.venv`` of its own, ``RAY_ADDRESS``,
  ``VIRTUAL_ENV`` and ``PYTHONPATH`` are unset, and ``python3`` on PATH is the bare
  interpreter the test's venv was made from (no Ferry, no Ray). Everything the blocks start
  carries a run id (``loadtest/procs.py``) and is stopped by PID.

What it does not prove, for CI's time (a venv that downloads Ray, numpy and the rest takes
minutes): that pip can download and build the dependencies on a fresh machine. The new venv
finds them already there -- a ``.pth`` file, written before the block makes the venv, puts a
directory of links to the test venv's packages on its path (pip, and Ferry's own editable
install, left out, so the block's pip installs both), and the test venv's console scripts
(``serve``, ``ray``) are copied into its ``bin/`` with their ``#!`` made the new venv's
python -- so ``pip install -e .`` resolves at once and installs only Ferry. ``.ci/run`` runs
README's test command itself (``tests/unit/test_readme_commands.py`` checks that it is the
same command), with real downloads. The GPU and cluster screens are not run here.

Ports: README's service binds 127.0.0.1:8000, as test_00_serve_config's does; pytest runs the
two modules one after the other on one worker, test_00 first (``tests/conftest.py``,
``OWN_RAY``), so the two never overlap. It waits up to a minute for port 8000 to be free
(a stopped Ray's Serve proxy can hold it a few seconds more: CI on 95055fb), then fails if
something still holds it, naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deployments import portcheck
from loadtest import procs
from loadtest.run import wait_ready
from tests.readme_blocks import ROOT, marked

pytestmark = pytest.mark.integration
README = os.path.join(ROOT, "README.md")
SKIP_PACKAGES = ("pip", "ferry")  # the block's venv gets its own pip and installs Ferry
READY_TIMEOUT_S = 300  # the venv, pip install -e ., then serve run's four deployments on 2 cores


def copy_checkout(dst: Path) -> None:
    """The files git tracks or would track (untracked, not ignored), as they are on disk."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in names)):
        src = Path(ROOT, name)
        if src.is_file() and not name.startswith(".venv/"):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).write_bytes(src.read_bytes())
            (dst / name).chmod(src.stat().st_mode)


def seed_venv(tree: Path, links: Path) -> None:
    """Before the block's ``python3 -m venv .venv``: a ``.pth`` in ``.venv``'s site-packages
    naming ``links`` (this interpreter's packages but pip's and Ferry's, linked) and this
    venv's console scripts in ``.venv/bin``, their ``#!`` the new venv's python. ``venv``
    keeps both (it clears nothing without ``--clear``)."""
    here = Path(sysconfig.get_paths()["purelib"])
    links.mkdir()
    for entry in here.iterdir():
        base = entry.name.split("-", 1)[0].lower()
        if entry.suffix == ".pth" or base in SKIP_PACKAGES or base.startswith("__editable__"):
            continue
        (links / entry.name).symlink_to(entry)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = tree / ".venv" / "lib" / ver / "site-packages"
    site.mkdir(parents=True)
    (site / "_test_venv_packages.pth").write_text(f"{links}\n")
    bindir, new_python = tree / ".venv" / "bin", tree / ".venv" / "bin" / "python"
    bindir.mkdir()
    for script in Path(sys.executable).parent.iterdir():
        name = script.name
        if name.startswith(("python", "pip", "activate", "Activate", "ferry")) or script.is_dir():
            continue
        text = script.read_bytes()
        if not text.startswith(b"#!"):
            continue
        body = text.split(b"\n", 1)[1] if b"\n" in text else b""
        (bindir / name).write_bytes(b"#!" + str(new_python).encode() + b"\n" + body)
        (bindir / name).chmod(0o755)


def block_env(tmp: Path, run_id: str) -> dict[str, str]:
    """A shell as a new user's: ``python3`` the bare interpreter, no venv active, no Ray
    address, nothing of the checkout on the path; everything marked with ``run_id``."""
    shim = tmp / "shim"
    shim.mkdir()
    (shim / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    env[procs.MARK] = run_id
    return env


def run_block(text: str, tree: Path, env: dict[str, str], timeout: float) -> str:
    r = subprocess.run(
        ["bash", "-e", "-c", text],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"{text}\nexit {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r.stdout


def stop_service(proc: subprocess.Popen, run_id: str) -> None:
    """Ctrl-C to the block's process group (serve run shuts Serve and its Ray down), then, by
    PID, whatever carries the run id still."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    procs.stop(run_id)


def json_values(text: str) -> list:
    """The JSON values printed one after another (curl ends none with a newline)."""
    out, at, dec = [], 0, json.JSONDecoder()
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        value, at = dec.raw_decode(text, at)
        out.append(value)
    return out


def check_answers(outputs: list[str]) -> None:
    """What README says the request blocks answer."""
    classify, v2 = outputs
    top = json.loads(classify)["top_k"]
    assert len(top) == 3 and top[0]["label"] == "1", classify
    ready, meta = json_values(v2)
    assert ready["ready"] is True, ready
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("image", "UINT8", [-1, 8, 8, 1])
    ], meta


def test_readme_first_screens_run_as_written_in_a_fresh_venv(tmp_path):
    (serve,) = marked(README, "serve")
    requests, runs = marked(README, "request"), marked(README, "run")
    url = serve.arg
    port = int(url.rsplit(":", 1)[1])
    # (test_00's Ray, stopped just before, may keep its proxy on the port a few seconds)
    held = portcheck.wait_free(port, 60)
    assert not held, f"port {port} is held: {held}"
    tree = tmp_path / "checkout"
    copy_checkout(tree)
    assert not (tree / ".venv").exists()
    seed_venv(tree, tmp_path / "test-venv-packages")
    run_id = procs.new_run_id("readme")
    env = block_env(tmp_path, run_id)
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        ["bash", "-e", "-c", serve.text],
        cwd=tree,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        if not wait_ready(url, READY_TIMEOUT_S, proc):
            pytest.fail(f"README's main command did not answer:\n{log.read_text()[-4000:]}")
        check_answers([run_block(b.text, tree, env, 60) for b in requests])
    finally:
        stop_service(proc, run_id)
    assert (tree / ".venv" / "bin" / "ferry").exists()  # the block's pip installed Ferry
    for b in runs:
        run_block(b.text, tree, env, 180)
