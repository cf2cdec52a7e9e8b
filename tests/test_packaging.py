"""The project as a library: a real wheel, installed apart from the checkout, runs from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_wheel_runs_outside_the_checkout(tmp_path, database_url, sharegpt_sample, ds_name):
    """pip builds a wheel; installed into a folder of its own (its dependencies come from this environment),
    the installed copy, not the checkout, migrates, builds, looks up and answers the CLIs from another folder."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("crest_spec-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in ("datastore/migrations/env.py", "datastore/migrations/script.py.mako",
                    "datastore/migrations/versions/0001_registry.py",
                    "datastore/migrations/versions/0002_reader_grants.py",
                    "datastore/migrations/versions/0003_live_outputs.py", "decoder/data/calibration.json",
                    "study/__main__.py", "ingest/__main__.py", "decoder/__main__.py", "datastore/__main__.py"):
        assert shipped in names, shipped
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "DATABASE_URL": database_url}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=600)

    where = run("-c", "import datastore, ingest, decoder, study; "
                      "print(*(m.__file__ for m in (datastore, ingest, decoder, study)))")
    assert where.returncode == 0 and all(f.startswith(str(site)) for f in where.stdout.split()), where.stdout
    check = run("-m", "datastore", "migrate", "--check")
    assert check.returncode == 0, check.stderr
    built = run("-m", "ingest", "build", "--name", ds_name, "--path", str(sharegpt_sample), "--limit", "5",
                "--top-t", "50", "--max-n", "2", "--quiet")
    assert built.returncode == 0, built.stderr[-2000:]
    looked = run("-c", "from datastore import Datastore, load_tokenizer\n"
                       f"tok = load_tokenizer()\nwith Datastore.open({ds_name!r}, tokenizer=tok) as ds:\n"
                       "    print('MATCH', ds.lookup(tok.encode('<|im_start|>user', add_special_tokens=False)).ngram)")
    assert looked.returncode == 0 and "MATCH" in looked.stdout, looked.stderr[-2000:]
    for module in ("decoder", "study"):
        helped = run("-m", module, "--help")
        assert helped.returncode == 0 and f"python -m {module}" in helped.stdout
