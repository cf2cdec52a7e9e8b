"""Our vLLM plugin (:mod:`serving.plugin`): installed as an entry point vLLM's own loader finds, it applies each change
once per process when vLLM imports the module it changes (never before: a process that does not load the runner pays
nothing), says once whether each applied, leaves out a change for a vLLM it does not name, and never raises into vLLM.
Each check runs in a fresh interpreter: a process's plugin state is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from support import REPO

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _run(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (it prints one JSON line last); returns that line and the log."""
    import os

    out = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO)\n" + code],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"log": out.stderr}


def test_the_entry_point_is_installed_with_the_package():
    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == "crest"]
    assert len(found) == 1 and found[0].value == "serving.plugin:register"


def test_vllms_loader_applies_each_change_when_its_module_is_imported_and_only_then():
    got = _run("""
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from serving.plugin import applied
before = {n: applied(n) for n in ("runner_hook", "vllm_fixes")}
loaded = "vllm.v1.worker.gpu_model_runner" in sys.modules
import vllm.v1.worker.gpu_model_runner as runner
import vllm.v1.sample.rejection_sampler as sampler
from serving.vllm_fixes import expand_batch_to_tokens
after = {n: applied(n) for n in ("runner_hook", "vllm_fixes")}
load_general_plugins()  # once per process
print(json.dumps({"before": before, "loaded": loaded, "after": after,
                  "wrapped": getattr(runner.GPUModelRunner.propose_draft_token_ids, "_crest_runner_hook", False),
                  "fixed": sampler.expand_batch_to_tokens is expand_batch_to_tokens}))
""")
    assert got["before"] == {"runner_hook": False, "vllm_fixes": False} and not got["loaded"]
    assert got["after"] == {"runner_hook": True, "vllm_fixes": True} and got["wrapped"] and got["fixed"]
    assert got["log"].count("crest plugin: runner_hook applied") == 1
    assert got["log"].count("crest plugin: vllm_fixes applied") == 1


def test_a_vllm_it_does_not_name_is_left_alone_and_told():
    got = _run("""
import json
import vllm
vllm.__version__ = "0.99.0"
from serving.plugin import register, applied
register()
import vllm.v1.worker.gpu_model_runner as runner
print(json.dumps({"applied": applied("runner_hook"),
                  "wrapped": getattr(runner.GPUModelRunner.propose_draft_token_ids, "_crest_runner_hook", False)}))
""")
    assert not got["applied"] and not got["wrapped"]
    assert "runner_hook not applied: vLLM 0.99.0 is not 0.30-0.33" in got["log"]


def test_a_change_that_fails_is_told_and_never_raised_into_vllms_import():
    got = _run("""
import json
import serving.vllm_fixes as fixes
def broken(module):
    raise KeyError("moved")
fixes.install = broken
from serving.plugin import register, applied
register()
import vllm.v1.sample.rejection_sampler
print(json.dumps({"applied": applied("vllm_fixes")}))
""")
    assert not got["applied"] and "vllm_fixes not applied (vLLM 0.32.0): it failed" in got["log"]


def test_building_a_proposer_patches_nothing_and_imports_no_vllm(chat_datastore, database_url):
    got = _run(f"""
import json, sys
from types import SimpleNamespace
from decoder.model import export_checkpoint
from serving.vllm_proposer import CrestProposer
from toolkit.settings import Settings
model = SimpleNamespace(max_model_len=256, tokenizer=str(export_checkpoint()), get_vocab_size=lambda: 49152)
p = CrestProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4), model_config=model),
                  Settings(datastore={chat_datastore!r}, database_url={database_url!r}, live=False, replicas="off"))
p.close()
p.close()
print(json.dumps({{"vllm": "vllm" in sys.modules}}))
""")
    assert not got["vllm"]
