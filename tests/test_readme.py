"""The README and the docs as a user follows them: every Python snippet the README marks to run runs against a small
real datastore, and every command the README or a page of ``docs/`` shows (``python -m ...`` and
``benchmarks/*.py``) answers ``--help``: no snippet or command drifts from the code it documents. The README stays
short enough to read in five minutes (at most 250 lines); its reference lives in ``docs/``."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from support import REPO

pytestmark = pytest.mark.clone

FENCE = re.compile(r"(?P<markers>(?:<!--[^\n]*-->\n)*)```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""What a user reads for commands: the README and the current docs (not ``docs/history``, a dated notebook)."""
README_LINES = 250


def _blocks(lang: str, pages: list = PAGES[:1]) -> list[tuple[str, str]]:
    """``(markers, body)`` of every fenced ``lang`` block of ``pages`` (default: the README), in order."""
    return [(m["markers"], m["body"]) for page in pages for m in FENCE.finditer(page.read_text())
            if m["lang"] == lang]


PYTHON = _blocks("python")


def test_the_readme_reads_in_five_minutes():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; move reference to docs/ (at most {README_LINES})"


def test_every_python_snippet_says_whether_it_runs():
    assert len(PYTHON) >= 5
    for markers, body in PYTHON:
        assert "readme-test: run" in markers or "readme-test: skip (" in markers, body[:200]


def _command(line: str) -> list[str] | None:
    """The ``--help`` form of a README command line: the interpreter, the module or script, and the subcommand and
    positional words up to the first option or placeholder; ``None`` for a line that is not one of ours."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # a quote the line's own shell would close later: the leading words are all we read
        words = line.split("#")[0].split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if len(words) < 2 or not words[0].endswith("python"):
        return None
    if words[1] == "-m":
        head, rest = [sys.executable, "-m", words[2]], words[3:]
    elif words[1].startswith("benchmarks/"):
        head, rest = [sys.executable, str(REPO / words[1])], words[2:]
    else:
        return None
    for word in rest:
        if word.startswith(("-", "[", "<", "$", "\"")) or word == "...":
            break
        head.append(word.split("|")[0])  # bench|replay|budget: the first
    return head + ["--help"]


def _commands() -> list[list[str]]:
    """Every command of the pages' bash blocks and of ``scripts/*.sh`` (their ``$PY``, ``exec`` and ``||`` forms)."""
    bodies = [body for _, body in _blocks("bash", PAGES)]
    bodies += [p.read_text().replace("$PY ", "python ").replace(".venv/bin/python ", "python ")
               for p in sorted((REPO / "scripts").glob("*.sh"))]
    out = []
    for body in bodies:
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("exec ").split("||")[-1].split("&&")[-1].strip()
            command = _command(line)
            if command is None or (command[1] == "-m" and not (REPO / command[2].split(".")[0]).is_dir()):
                continue  # not a command, or another package's
            if command not in out:
                out.append(command)
    return out


COMMANDS = _commands()


def test_the_docs_show_every_command_their_figures_need():
    shown = [" ".join(c[2:-1]) if c[1] == "-m" else os.path.basename(c[1]) for c in COMMANDS]
    for needed in ("ingest build", "benchmarks.rest_index", "research.hf_bench bench", "serving", "benchmarks.peers",
                   "evaluation references", "evaluation calibrate", "datastore grant-reader crest_reader"):
        assert any(s.startswith(needed) for s in shown), (needed, shown)
    text = "".join(page.read_text() for page in PAGES)
    assert "--name code --source code --path" in text
    assert "CREST_EVAL_DATA=DIR python -m research.hf_bench bench --half all" in text


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[1:-1]).replace(str(REPO) + "/", "") for c in COMMANDS])
def test_every_command_answers_help(command):
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "usage:" in proc.stdout, (command, proc.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("number", [i for i, (m, _) in enumerate(PYTHON) if "readme-test: run" in m])
def test_every_runnable_python_snippet_runs(number, tmp_path, database_url, chat_datastore):
    """Each snippet as a user pastes it, in a process of its own, the datastore name and URLs pointed at the test's."""
    body = PYTHON[number][1].replace('"sharegpt"', repr(chat_datastore))
    body = re.sub(r'"postgresql://[^"]*"', repr(database_url), body)
    env = {**os.environ, "DATABASE_URL": database_url}
    proc = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), "every runnable snippet prints what it shows"
