"""Fixtures of the S4C tests: a small real feature set (the target run over ShareGPT sequences)."""

from __future__ import annotations

import pytest

from ingest.sources import iter_documents
from research.s4c.features import extract, first_tokens


@pytest.fixture(scope="session")
def feature_set(target, sharegpt_sample, tmp_path_factory):
    """The target's features of 10 ShareGPT sequences of at most 96 tokens, extracted into a temporary folder."""
    _, batches = iter_documents("sharegpt", sharegpt_sample, tokenizer=target.tokenizer, limit=40)
    texts = (t for b in batches for t in b.column(0).to_pylist())
    seqs = first_tokens(texts, target.tokenizer, seq_len=96, max_tokens=960)
    return extract(target, seqs, tmp_path_factory.mktemp("features"), about={"test": "sharegpt sample"})
