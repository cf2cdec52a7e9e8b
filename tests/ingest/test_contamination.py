"""The contamination screen (:mod:`ingest.contamination`) against a brute-force oracle, on real evaluation items and
real tokens."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ingest.contamination import NGRAM, THRESHOLD, screen_documents, screen_items, screen_stream
from ingest.tokens import TokenStreamWriter
from toolkit.eval_sets import read_rows


def _oracle(docs: list[list[int]], items: dict[str, list[tuple[str, np.ndarray]]], n: int) -> dict:
    """Per item, how many of its n-gram windows occur inside one document: plain Python sets."""
    corpus = {tuple(d[i:i + n]) for d in docs for i in range(len(d) - n + 1)}
    out = {}
    for part, pairs in items.items():
        for item, ids in pairs:
            grams = [tuple(int(t) for t in ids[i:i + n]) for i in range(len(ids) - n + 1)]
            shared = sum(g in corpus for g in grams)
            if shared:
                out[(part, item)] = (shared, len(grams))
    return out


def _write(path: Path, docs: list[list[int]], names: list[str]) -> Path:
    with TokenStreamWriter(path, with_names=True) as w:
        w.write([np.asarray(d, np.uint32) for d in docs], names)
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_screen_matches_the_oracle(tokenizer, tmp_path, seed):
    """Random documents with slices of real items planted in them (some cut across a document boundary): every
    item's shared count is the oracle's, and no n-gram spans two documents."""
    rng = random.Random(seed)
    items = screen_items(tokenizer)
    flat = [(part, item, ids) for part, pairs in items.items() for item, ids in pairs if len(ids) >= NGRAM]
    docs: list[list[int]] = []
    for k in range(40):
        doc = [rng.randrange(1, 49_000) for _ in range(rng.randrange(5, 300))]
        if k % 3 == 0:
            _, _, ids = rng.choice(flat)
            a = rng.randrange(0, len(ids) - NGRAM + 1)
            doc[len(doc) // 2:len(doc) // 2] = [int(t) for t in ids[a:a + rng.randrange(NGRAM, NGRAM + 40)]]
        docs.append(doc)
    # one item split over two neighbouring documents: its halves are shorter than 13 tokens each
    _, _, ids = flat[seed]
    docs[5] = docs[5] + [int(t) for t in ids[:NGRAM - 1]]
    docs[6] = [int(t) for t in ids[NGRAM - 1:2 * NGRAM - 2]] + docs[6]
    path = _write(tmp_path / "s.u32", docs, [f"doc{k}.py" for k in range(len(docs))])
    got = screen_stream(path, items)
    want = _oracle(docs, items, NGRAM)
    found = {(part, item): (o["shared"], o["ngrams"]) for part, r in got["parts"].items()
             for item, o in r["overlaps"].items()}
    assert found == want
    assert sum(r["shared_any"] for r in got["parts"].values()) == len(want)
    assert got["n"] == NGRAM and got["threshold"] == THRESHOLD


def test_screen_names_the_documents_and_flags_by_share(tokenizer, tmp_path):
    rows = read_rows("humaneval")
    leaked = rows[5]
    texts = ["import os\nprint(os.getcwd())\n", leaked["prompt"] + leaked["canonical_solution"],
             "def add(a, b):\n    return a + b\n"]
    enc = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    path = _write(tmp_path / "s.u32", [e.ids for e in enc], ["a.py", "pkg/leak.py", "c.py"])
    got = screen_stream(path, screen_items(tokenizer))
    prompts = got["parts"]["humaneval"]
    hit = prompts["overlaps"][leaked["task_id"]]
    assert hit["documents"] == ["pkg/leak.py"] and hit["share"] >= THRESHOLD
    assert prompts["contaminated"] >= 1 and got["parts"]["spec_bench"]["contaminated"] == 0
    assert all(o["share"] < THRESHOLD for k, o in prompts["overlaps"].items() if k != leaked["task_id"])


def test_screen_refuses_bad_parameters(tmp_path, tokenizer):
    path = _write(tmp_path / "s.u32", [[1, 2, 3]], ["x"])
    for kw in ({"n": 0}, {"threshold": 0.0}, {"threshold": 1.5}):
        with pytest.raises(ValueError, match="threshold"):
            screen_stream(path, {}, **kw)


@pytest.mark.parametrize("seed", [0, 1])
def test_each_document_screened_alone_matches_the_oracle(tokenizer, seed):
    """Random documents, some holding most of a real item, some a third of one, some half of one split between two
    neighbours: a document is flagged exactly when the oracle, on that document alone, finds at least the threshold's
    share of an item's 13-grams in it (a share split across documents flags neither)."""
    rng = random.Random(seed)
    items = screen_items(tokenizer)
    flat = [(part, item, ids) for part, pairs in items.items() for item, ids in pairs if len(ids) >= 4 * NGRAM]
    docs: list[list[int]] = []
    for k in range(30):
        doc = [rng.randrange(1, 49_000) for _ in range(rng.randrange(5, 200))]
        _, _, ids = rng.choice(flat)
        keep = {0: len(ids), 1: len(ids) // 3}.get(k % 4, 0)
        doc[len(doc) // 2:len(doc) // 2] = [int(t) for t in ids[:keep]]
        docs.append(doc)
    _, _, ids = flat[seed]
    docs[10] += [int(t) for t in ids[:len(ids) // 2]]
    docs[11] = [int(t) for t in ids[len(ids) // 2:]] + docs[11]
    got = screen_documents([np.asarray(d) for d in docs], items)
    for doc, flag in zip(docs, got):
        alone = _oracle([doc], items, NGRAM)
        over = [f"{part}/{item}" for (part, item), (shared, total) in alone.items() if shared / total >= THRESHOLD]
        assert (flag is not None) == bool(over) and (flag is None or flag in over)
    assert sum(f is not None for f in got) >= 8 and got[10] is None and got[11] is None
    assert screen_documents([], items) == []
