"""Training the head on a lent GPU, run here on the CPU as the GPU runs it: ``head-pack`` packs the target and the
prompts, ``evaluation/head_gpu.py`` runs as a file (no project import but the head's forward) on the pack, with the
GGUF's first part in another folder as when it travelled apart, and ``train-head --weights`` turns what it wrote
into a served head."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import REPO, printed, run_script


@pytest.mark.slow
def test_pack_then_runner_then_weights(database_url, chat_datastore, references, tmp_path):
    from decoder.model import load_target
    from drafting import DraftHead
    from evaluation.features import target_weights
    from toolkit.tokenizer import resolve_model

    pack, first, out = tmp_path / "pack", tmp_path / "first", tmp_path / "out"
    printed_pack = run_script("evaluation", "head-pack", "--out", pack, "--prompts", "3", "--split-mib", "60",
                              "--references", references, url=database_url)
    record = json.loads((pack / "pack.json").read_text())
    assert record["prompts"] == 3 and record["gguf_parts"] == ["model.gguf.0", "model.gguf.1"]
    assert printed(printed_pack, r"\{\"target\"")
    src = resolve_model(None)
    assert src.gguf_file is not None
    parts = b"".join((pack / p).read_bytes() for p in record["gguf_parts"])
    assert parts == (Path(src.path) / src.gguf_file).read_bytes()  # the parts are the GGUF, byte for byte
    with np.load(pack / "data.npz") as data:
        assert len(data["prompt_offsets"]) == 4 and data["check_states"].shape == (len(data["check_ids"]), 576)
    first.mkdir()
    os.replace(pack / "model.gguf.0", first / "model.gguf.0")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cut = tmp_path / "cut"  # the pack with its second part cut short in transfer: refused before anything loads
    shutil.copytree(pack, cut)
    (cut / "model.gguf.1").write_bytes((pack / "model.gguf.1").read_bytes()[:1000])
    refused = subprocess.run([sys.executable, "evaluation/head_gpu.py", "--pack", str(cut), "--parts", str(first),
                              "--out", str(tmp_path / "no"), "--device", "cpu"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "do not make the target's GGUF" in refused.stderr
    assert not (cut / "model.gguf").exists() and not (tmp_path / "no" / "head_1024.npz").exists()
    proc = subprocess.run([sys.executable, "evaluation/head_gpu.py", "--pack", str(pack), "--parts", str(first),
                           "--out", str(out), "--device", "cpu", "--generate-minutes", "0.01", "--new-tokens", "4",
                           "--train-minutes", "0.01", "--batch", "16", "--hidden", "16"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["check_max_abs_diff"] == 0.0  # the same float32 target, on the same CPU
    # every round answers the three prompts in one batch: the positions are the fit halves', the prompts' once a
    # round, and the answers'
    assert run["answers"] == 3 * run["rounds"] >= 3
    assert run["positions"] == record["fit_tokens"] + run["rounds"] * record["prompt_tokens"] + run["answer_tokens"]
    assert run["steps"] > 0 and (out / "head_16.npz").exists()
    served = tmp_path / "head.npz"
    got = run_script("evaluation", "train-head", "--weights", out / "head_16.npz", "--out", served, "--datastore",
                     chat_datastore, "--code-datastore", chat_datastore, "--references", references, url=database_url)
    assert printed(got, r"wrote .*head.npz")
    head = DraftHead.load(served)
    assert head.meta["trained"]["steps"] == run["steps"] and head.calibration.with_model
    assert head.fits(target_weights(load_target(None, device="cpu"))[1].float().numpy())
    with np.load(out / "head_16.npz") as z:  # the GPU's weights, as the served file keeps them (float16)
        assert all(np.array_equal(getattr(head, k), z[k].astype(np.float16).astype(np.float32)) for k in z.files)


def test_weights_of_another_shape_or_file_are_refused(tmp_path):
    from evaluation.train_head import _fits, _weights

    np.savez(tmp_path / "half.npz", up=np.zeros((1152, 8), np.float32))
    with pytest.raises(ValueError, match="lacks up_bias.*head_gpu.py"):
        _weights(tmp_path / "half.npz")
    arrays: dict = {"up": np.zeros((1152, 8)), "up_bias": np.zeros(8), "down": np.zeros((8, 576)),
              "down_bias": np.zeros(576), "state_gain": np.ones(576), "token_gain": np.ones(576)}
    np.savez(tmp_path / "head.npz", **arrays)
    got, trained = _weights(tmp_path / "head.npz")
    with pytest.raises(ValueError, match=r"not \[1024, hidden\] and \[hidden, 512\] for this target"):
        _fits(got, 512, tmp_path / "head.npz")
    _fits(got, 576, tmp_path / "head.npz")
    assert got["up"].dtype == np.float32 and trained == {"weights": "head.npz", "trained": None}
    (tmp_path / "cut.npz").write_bytes((tmp_path / "head.npz").read_bytes()[:300])  # a transfer cut short
    with pytest.raises(ValueError, match="cut.npz is cut off or corrupt"):
        _weights(tmp_path / "cut.npz")


def test_weights_with_a_training_option_are_refused(tmp_path):
    from evaluation.cli import build_parser

    args = build_parser().parse_args(["train-head", "--weights", str(tmp_path / "head.npz"), "--minutes", "3"])
    with pytest.raises(ValueError, match="--weights takes a head trained elsewhere, --minutes trains one here"):
        args.run(args)
    args = build_parser().parse_args(["train-head", "--weights", str(tmp_path / "none.npz")])
    with pytest.raises(FileNotFoundError, match="none.npz does not exist; pass the head_<width>.npz"):
        args.run(args)
