"""The native drafting core against its Python reference: the same drafts, bit for bit, on random request streams,
random datastore trees and random calibrations (hypothesis), and the same token-tree payloads parsed or refused."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore import codec
from datastore.codec import CodecError, TreeBatch, encode_tree
from datastore.tree import Match, TokenTree
from decoder.calibration import FEATURES, Calibration
from decoder.core import NativeCore, PythonCore
from decoder.local import SuffixMatching, TrieMatching

crest_native = pytest.importorskip("crest_native", reason="the native core is not built (pip install -e .)")


def random_tree(rng: np.random.Generator, vocab: int, size: int) -> TokenTree:
    """A valid token tree: siblings differ, counts never rise along a path."""
    toks: list[int] = []
    parents: list[int] = []
    counts: list[int] = []
    kids: dict[int, set] = {}
    for i in range(size):
        p = int(rng.integers(-1, i)) if i else -1
        t = int(rng.integers(0, vocab))
        if t in kids.setdefault(p, set()):
            continue
        kids[p].add(t)
        toks.append(t)
        parents.append(p if p < len(toks) - 1 else -1)
        counts.append(int(rng.integers(1, 50)) if parents[-1] < 0 else int(rng.integers(1, counts[parents[-1]] + 1)))
    top = sum(c for c, p in zip(counts, parents) if p < 0)
    return TokenTree(np.array(toks, np.uint32), np.array(parents, np.int32), np.array(counts, np.uint32),
                     int(rng.integers(top, top + 20)) if rng.random() < 0.8 else 0)


def same(a, b) -> None:
    assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.parents, b.parents)
    assert a.scores.tobytes() == b.scores.tobytes(), (a.scores, b.scores)  # the same bits
    assert a.score_kind is b.score_kind


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.booleans(), st.sampled_from([0.0, 0.05, 0.3]),
       st.sampled_from([0, 600, 1 << 20]))
def test_native_drafts_equal_the_reference(seed, vocab_bits, chain, min_score, outputs_bytes):
    rng = np.random.default_rng(seed)
    vocab = 2 + vocab_bits * 3
    cal = Calibration(rng.normal(scale=0.7, size=len(FEATURES)), float(rng.normal()), float(rng.choice([0.0, 1.0])))
    py, native = PythonCore(cal, outputs_bytes=outputs_bytes), NativeCore(cal, outputs_bytes=outputs_bytes)
    active: dict[int, tuple] = {}
    for _ in range(40):
        roll = rng.random()
        if roll < 0.2 or not active:  # a new request
            prompt = rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()
            active[len(active) + 1000 * int(rng.integers(1 << 20))] = (py.start(prompt), native.start(prompt))
        elif roll < 0.3:  # one finishes: its output feeds the output index of both
            key = list(active)[int(rng.integers(len(active)))]
            a, b = active.pop(key)
            assert py.stop(a) == native.stop(b)
        else:  # a step for every active request: random datastore candidates and live trees
            keys = list(active)
            budgets = [int(rng.integers(1, 20)) for _ in keys]
            stored = [[Match(tuple(range(n)), random_tree(rng, vocab, int(rng.integers(0, 30))))
                       for n in range(int(rng.integers(0, 4)), 0, -1)] for _ in keys]
            live = [Match((1, 2), random_tree(rng, vocab, int(rng.integers(0, 20)))) if rng.random() < 0.4 else None
                    for _ in keys]
            want = py.draft([active[k][0] for k in keys], budgets, stored, live, chain, min_score)
            got = native.draft([active[k][1] for k in keys], budgets, stored, live, chain, min_score)
            for (d1, c1), (d2, c2) in zip(want, got):
                same(d1, d2)
                assert c1 == c2
            for k in keys:  # the target commits a few tokens
                toks = rng.integers(0, vocab, size=int(rng.integers(1, 4))).tolist()
                py.extend(active[k][0], toks)
                native.extend(active[k][1], toks)
                assert py.context(active[k][0]) == native.context(active[k][1])
    assert py.outputs_info() == {k: v for k, v in native.outputs_info().items() if k != "allocated"}


def test_native_core_refuses_what_it_does_not_do():
    cal = Calibration(np.zeros(len(FEATURES)), 0.0, meta={"local": TrieMatching().config()})
    with pytest.raises(ValueError, match="suffix automata only"):
        NativeCore(cal)
    with pytest.raises(ValueError, match="fitted with"):
        NativeCore(Calibration(np.zeros(len(FEATURES)), 0.0), local=SuffixMatching(max_depth=3))
    core = NativeCore(Calibration(np.zeros(len(FEATURES)), 0.0))
    with pytest.raises(ValueError, match="token id"):
        core.start([-1])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 70), st.sampled_from([1, 2, 3, 4]))
def test_native_payload_parser_equals_the_reference(seed, size, width):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, min(1 << (8 * width), 1 << 20), size)
    raw = codec._payloads(TreeBatch.from_trees([tree]))[0].tobytes()
    w = codec._token_width(int(tree.token_ids.max(initial=0)))
    tokens, parents, counts, root = crest_native.parse_tree_payload(raw, w)
    assert TokenTree(tokens, parents, counts, root) == codec._parse_payload(raw, w) == tree
    # damaged payloads: the same refusals, with the same messages
    for damaged in (raw[:-1], raw + b"\x00", raw[:1] + bytes([0xFF]) * 12, bytes(rng.integers(0, 256, 12).tolist())):
        try:
            want = codec._parse_payload(damaged, w)
        except CodecError as exc:
            with pytest.raises(ValueError) as got:
                crest_native.parse_tree_payload(damaged, w)
            assert str(got.value) == str(exc)
        else:
            t, p, c, r = crest_native.parse_tree_payload(damaged, w)
            assert TokenTree.trusted(t, p, c, r) == want


def test_decode_tree_uses_the_native_parser():
    tree = TokenTree(np.array([3, 4], np.uint32), np.array([-1, 0], np.int32), np.array([5, 2], np.uint32), 9)
    blob = encode_tree(tree, "none")
    assert codec._native_parse is crest_native.parse_tree_payload
    assert codec.decode_tree(blob) == tree
    bad = bytearray(blob)
    bad[-1] ^= 0x40  # a count now above its parent's, with the CRC made to match
    raw = bytes(bad[8:])
    bad[3:7] = zlib.crc32(raw, zlib.crc32(bytes(bad[:3]))).to_bytes(4, "little")
    with pytest.raises(CodecError, match="counts more than its parent"):
        codec.decode_tree(bytes(bad))


@pytest.mark.parametrize("chain", [True, False])
def test_native_and_reference_drafts_agree_on_the_evaluation_sets(chain, chat_datastore, database_url, tokenizer):
    """Request streams made of real evaluation prompts (Spec-Bench's every category, HumanEval), each request's
    second half committed a few tokens at a time, drafted from a real datastore by a service on each core: the
    same drafts at every step, and the same output index after every request (both learn each finished output)."""
    from datastore.shared import SharedDatastore
    from decoder.drafters import DatastoreSource
    from decoder.prompts import load_prompts
    from decoder.service import DraftingService

    prompts = load_prompts("spec_bench", tokenizer, limit=1) + load_prompts("humaneval", tokenizer, limit=6)
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    native, reference = DraftingService(source, core=NativeCore()), DraftingService(source, core=PythonCore())
    compared = nonempty = 0
    try:
        for i, p in enumerate(prompts):
            ids = [int(t) for t in p.token_ids]
            cut = max(4, len(ids) // 2)
            for svc in (native, reference):
                svc.start_request(i, ids[:cut])
            for pos in range(cut, len(ids), 3):
                budget = (3, 8, 40)[pos % 3]
                a = native.propose([(i, budget)], chain=chain, min_score=0.05)[0]
                b = reference.propose([(i, budget)], chain=chain, min_score=0.05)[0]
                same(a, b)
                compared += 1
                nonempty += len(a) > 0
                for svc in (native, reference):
                    svc.add_tokens(i, ids[pos:pos + 3])
            for svc in (native, reference):
                svc.stop_request(i)
            assert {k: v for k, v in native.core.outputs_info().items() if k != "allocated"} \
                == reference.core.outputs_info()
    finally:
        source.close()
    assert compared > 300 and nonempty > compared // 2 and native.core.outputs_info()["outputs"] == len(prompts)
