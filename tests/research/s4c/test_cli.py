"""``python -m research.s4c``: training a small run end to end through the command (progress, table, the heads file it
writes and their record), and its errors at the door."""

from __future__ import annotations

import subprocess
import sys

import torch
from safetensors.torch import load_file

from research.s4c.store import read_record
from support import REPO


def s4c(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "research.s4c", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_train_writes_heads_with_their_record(tmp_path, sharegpt_sample):
    out = tmp_path / "heads.safetensors"
    done = s4c("train", "--corpus", str(sharegpt_sample), "--tokens", "2K", "--seq-len", "256", "--epochs", "1",
               "--work", str(tmp_path / "work"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "top-1" in done.stdout and "peak RSS" in done.stdout and "training tokens" in done.stdout
    record = read_record(out)
    assert record["config"]["num_heads"] == 3 and record["target"] == "SmolLM2-135M-Instruct"
    acc = record["record"]["accuracy"]
    assert len(acc) == 3 and all(0.0 <= a["top1"] <= a["top5"] <= 1.0 and a["positions"] > 0 for a in acc)
    assert record["record"]["data"]["tokens"] == 2000 and 0 < record["record"]["draft_vocab"] <= 16384
    again = s4c("train", "--corpus", str(sharegpt_sample), "--tokens", "2K", "--seq-len", "256", "--epochs", "1",
                "--work", str(tmp_path / "work"), "--out", str(tmp_path / "again.safetensors"))
    assert again.returncode == 0, again.stderr  # resumed from the work folder's features and finished checkpoint
    first, second = load_file(out), load_file(tmp_path / "again.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_bad_input_is_refused_naming_the_fix(tmp_path):
    missing = s4c("info", "--name", "no-such-heads")
    assert missing.returncode == 2
    assert "python -m research.s4c train --name no-such-heads" in missing.stderr and "Traceback" not in missing.stderr
    bad = s4c("train", "--name", "../x")
    assert bad.returncode == 2 and "heads name" in bad.stderr
    zero = s4c("train", "--epochs", "0")
    assert zero.returncode == 2 and "must be >= 1" in zero.stderr
    nofile = s4c("train", "--corpus", str(tmp_path / "none.json"))
    assert nofile.returncode == 2 and "none.json" in nofile.stderr


def test_info_prints_the_shipped_heads_record():
    done = s4c("info")
    assert done.returncode == 0, done.stderr
    assert "SmolLM2-135M-Instruct" in done.stdout and "top-1" in done.stdout
