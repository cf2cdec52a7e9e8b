"""Helpers the tests share (fixtures are in ``conftest.py``): the repository's root, a small real build, URLs with
other parameters, outputs appended to a live layer, and running an entry point in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from hypothesis import strategies as st

from datastore.tree import TokenTree

REPO = Path(__file__).resolve().parents[1]
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"
"""A server no test can reach."""
NO_SUCH = "/no/such/path-0f3a"


def call(main, argv: list[str], capsys) -> tuple[int, str]:
    """Run an entry point in-process: ``(exit code, everything it printed)``."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    printed = capsys.readouterr()
    return int(code or 0), printed.out + printed.err


def check_refusal(main, argv, code: int, names: tuple[str, ...], capsys) -> None:
    """Run an entry point with bad input: it exits ``code`` with a message naming each of ``names``, no traceback, no
    password, no doubled punctuation, within 30 s."""
    t0 = time.monotonic()
    got, text = call(main, argv, capsys)
    assert got == code, (argv, got, text[-2000:])
    assert "Traceback" not in text, (argv, text[-2000:])
    for needle in names:
        assert needle in text, (argv, needle, text[-2000:])
    assert "hunter2" not in text  # a password is never echoed
    # no doubled punctuation ("1..8" is a range, "..." an ellipsis)
    assert not re.search(r"(?<![\d.])\.\.(?![\d.])|;;|::\s|, ,", text), (argv, text)
    assert time.monotonic() - t0 < 30, argv  # nothing hangs: bad input is refused at once


def build_small(url: str, name: str, sample: Path) -> int:
    """Build datastore ``name`` from the first 10 conversations of the ShareGPT sample (top-t 50, n <= 2);
    returns its build id. A few seconds: for tests that rebuild or drop datastores."""
    from ingest import BuildConfig, build_datastore

    return build_datastore(BuildConfig(name=name, path=sample, limit=10, top_t=50, max_n=2, database_url=url),
                           progress=False).build_id


def append_outputs(url: str, name: str, outputs: list[list[int]], origin: str) -> None:
    """Append ``outputs`` to datastore ``name``'s live layer under ``origin``, as a decoder's writer does, and wait
    until they are written."""
    from live.writer import LiveWriter

    writer = LiveWriter(name, url, origin=origin)
    for o in outputs:
        assert writer.append(o)
    assert writer.flush(30)
    writer.close()


def clear_live(url: str, name: str, also_base: bool = False) -> None:
    """Empty datastore ``name``'s live layer (its appended outputs and ``name.live``), and drop ``name`` itself with
    ``also_base``. A compaction an engine started may outlive it for a moment: it is waited for (up to 2 minutes)."""
    from datastore.admin.catalog import drop_datastore, empty_live_layer
    from datastore.errors import DatastoreNotFound

    empty_live_layer(url, name, wait_s=120)
    if also_base:
        try:
            drop_datastore(url, name)
        except DatastoreNotFound:
            pass


def with_params(url: str, **changes) -> str:
    """``url`` as a libpq key/value string with some parameters changed (and no password)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo(**(params | changes))


def run_module(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m ARGS...`` in the repository's root, its output captured."""
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env)


def run_script(module: str, *args: object, url: str, env: dict | None = None, timeout: float = 600) -> str:
    """``python -m MODULE ARGS`` in the repository's root with ``DATABASE_URL=url`` (so that no script ever falls back
    to the embedded server) and ``env``; asserts it exits 0 and returns what it printed (stdout, then stderr)."""
    proc = run_module(module, *map(str, args), env={**os.environ, "DATABASE_URL": url, **(env or {})}, timeout=timeout)
    assert proc.returncode == 0, f"{module} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


def printed(text: str, pattern: str) -> list[re.Match]:
    """Every line of ``text`` that matches ``pattern`` (from its start)."""
    return [m for line in text.splitlines() if (m := re.match(pattern, line))]


def drop_datastores(url: str, *names: str) -> None:
    """Drop datastores ``names`` and empty their live layers (outputs and ``<name>.live``), where they exist."""
    from datastore.admin.catalog import drop_datastore, empty_live_layer
    from datastore.errors import DatastoreNotFound

    for name in names:
        empty_live_layer(url, name, wait_s=120)
        try:
            drop_datastore(url, name)
        except DatastoreNotFound:
            pass


REF_TOKENS = 24  # new tokens of each saved reference in :func:`saved_references` (their provenance says 128)


def saved_references(target, tokenizer, folder: Path) -> Path:
    """A ``--references`` folder as ``python -m evaluation references`` writes it (``<set>.jsonl``, under the
    provenance the scripts check: the whole set's prompts, the default model in fp32, 128 new tokens) holding
    Spec-Bench's first three prompts (``writing``: the fit half's first two, the report half's first), HumanEval's
    first three and the second turn of Spec-Bench's first. Each output is the first :data:`REF_TOKENS` tokens of the
    target's plain-greedy output (:func:`decoder.greedy_generate`; greedy, so the prefix of its 128 tokens)."""
    import torch

    from decoder import greedy_generate
    from evaluation.greedy import _second_turns
    from evaluation.prompts import load_prompts
    from evaluation.references import expected, write_references

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 135M model, one token at a time: faster on one thread than on two contended ones
    try:
        def greedy(prompt: list[int]) -> list[int]:
            return greedy_generate(target, prompt, max_new_tokens=REF_TOKENS).output_ids

        rows = {name: [(p.id, list(p.token_ids), greedy(list(p.token_ids)))
                       for p in load_prompts(name, tokenizer)[:3]] for name in ("spec_bench", "humaneval")}
        (second,) = _second_turns(tokenizer, {pid: out for pid, _, out in rows["spec_bench"][:1]})
        rows["spec_bench_turn2"] = [(second[0], second[2], greedy(second[2]))]
    finally:
        torch.set_num_threads(threads)
    for name, saved in rows.items():
        write_references(folder / f"{name}.jsonl", expected(name, tokenizer, max_new_tokens=128), saved)
    return folder


def random_tree(rng: np.random.Generator, vocab: int, size: int) -> TokenTree:
    """A valid token tree: siblings differ, counts never rise along a path."""
    toks: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    kids: dict[int, set] = {}
    for i in range(size):
        p = int(rng.integers(-1, i)) if i else -1
        p = p if p < len(toks) else -1  # a parent skipped below: a root
        t = int(rng.integers(0, vocab))
        if t in kids.setdefault(p, set()):
            continue
        kids[p].add(t)
        toks.append(t)
        parents.append(p)
        counts.append(int(rng.integers(1, 50)) if parents[-1] < 0 else int(rng.integers(1, counts[parents[-1]] + 1)))
    top = sum(c for c, p in zip(counts, parents) if p < 0)
    return TokenTree(np.array(toks, np.uint32), np.array(parents, np.int32), np.array(counts, np.uint32),
                     int(rng.integers(top, top + 20)) if rng.random() < 0.8 else 0)


def drawn_tree(draw, vocab: int, max_nodes: int) -> TokenTree:
    n = draw(st.integers(0, max_nodes))
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[int] = []
    seen: set[tuple[int, int]] = set()
    for i in range(n):
        p = draw(st.integers(-1, i - 1))
        t = draw(st.integers(0, vocab - 1))
        if (p, t) in seen:
            continue
        seen.add((p, t))
        # remap to the compacted index space
        p = -1 if p < 0 or p >= len(toks) else p
        if (p, t) in {(a, b) for a, b in zip(pars, toks)}:
            continue
        cap = cnts[p] if p >= 0 else 50
        toks.append(t)
        pars.append(p)
        cnts.append(draw(st.integers(1, cap)))
    root = max([c for c, p in zip(cnts, pars) if p < 0], default=0) + draw(st.integers(0, 20))
    return TokenTree(np.array(toks, np.uint32), np.array(pars, np.int32), np.array(cnts, np.uint32), root)


@st.composite
def trees(draw):
    return drawn_tree(draw, vocab=4, max_nodes=30)


def tree_paths(tree) -> list[tuple[int, ...]]:
    """Each node's path from the root (a :class:`TokenTree` or a draft)."""
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(tree.token_ids.tolist(), tree.parents.tolist()):
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    return paths


def tree_from_paths(paths: dict[tuple, int], root: int = 0) -> TokenTree:
    """A token tree from ``path -> count`` (parents listed before children)."""
    index: dict[tuple, int] = {}
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[int] = []
    for path, c in paths.items():
        index[path] = len(toks)
        toks.append(path[-1])
        pars.append(index[path[:-1]] if len(path) > 1 else -1)
        cnts.append(c)
    return TokenTree(np.array(toks), np.array(pars), np.array(cnts), root)


def tiny_heads(target, seed: int = 0, num_heads: int = 2):
    """Untrained S4C heads of the target's width with one attention head and a narrow MLP (seconds to train)."""
    import dataclasses

    import torch

    from evaluation.features import target_weights
    from research.s4c.heads import HeadsConfig, S4CHeads

    config = dataclasses.replace(HeadsConfig.of_target(target.model.config), num_attention_heads=1,
                                 num_key_value_heads=1, intermediate_size=64, num_heads=num_heads)
    torch.manual_seed(seed)
    return S4CHeads(config, *target_weights(target))


def native_core(*, sources=("ds", "live", "local", "outputs"), calibration=None, **options):
    """A native core (``crest_native.Core``) scoring with ``calibration`` (default: the shipped one), its settings by
    keyword (:func:`drafting.native.core_options`)."""
    from drafting import Calibration
    from drafting.native import core_options

    cal = calibration or Calibration.load()
    made = core_options(cal, sources, **{k: v for k, v in options.items()
                                         if k in ("outputs_bytes", "back_off_min_budget", "max_tokens")})
    for name, value in options.items():
        if name not in ("outputs_bytes", "back_off_min_budget", "max_tokens"):
            setattr(made, name, value)
    from drafting.native import native_core as make

    return make(cal, made)


def native_step(core, handles, budgets, source=None, *, chain=False, min_score=0.0, curve=None, appended=None):
    """One ``Core.step`` of ``handles`` (``[rows]``) with ``budgets``, from ``source`` (replicas as a ``(datastore,
    live, delta)`` tuple, given ``crest_native.Trees``, or ``None``: plan); ``appended``: each row's new tokens."""
    import crest_native

    b = crest_native.Batch()
    b.handles, b.budgets = np.asarray(handles, np.int64), np.asarray(budgets, np.int64)
    b.chain, b.min_score, b.curve = chain, min_score, curve
    if appended is not None:
        b.appended = np.asarray([t for row in appended for t in row], np.uint32)
        b.counts = np.asarray([len(row) for row in appended], np.int64)
    if isinstance(source, tuple):  # one datastore's replicas: its set
        datastore, live, delta = (*source, None)[:3]
        source = crest_native.StoreSets([(datastore, None, live, delta)])
    return core.step(b, source)


def given_trees(stored, live=None, delta=None):
    """``crest_native.Trees`` of per-row candidates (lists of native trees) and live/delta trees (``None``: none)."""
    import crest_native

    rows = len(stored)
    return crest_native.Trees([list(s) for s in stored], list(live or [None] * rows), list(delta or [None] * rows))


def native_extend(core, handle: int, tokens) -> None:
    """Append ``tokens`` to a request of ``core`` (a step that follows them and drafts nothing)."""
    native_step(core, [handle], [0], given_trees([[]]), appended=[[int(t) for t in tokens]])


def step_drafts(made) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A native step's drafts, per row: ``(tokens, parents, scores)``."""
    o = made.offsets.tolist()
    return [(made.tokens[a:b], made.parents[a:b], made.scores[a:b]) for a, b in zip(o, o[1:])]


def alive_after(pids: list[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still running (a zombie has ended) after waiting up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
