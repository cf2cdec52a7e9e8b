"""A lookup's context checked at the door (:mod:`datastore.context`): both clients refuse what they would otherwise
coerce, with :class:`datastore.errors.InvalidContext` naming the input, and a context is checked by the ids it uses."""

from __future__ import annotations

import re

import numpy as np
import pytest

from datastore.errors import BadDatabaseUrl, InvalidContext


def test_lookups_refuse_what_they_would_coerce(chat_datastore, database_url, tokenizer, eval_prompts):
    from datastore import Datastore, SharedDatastore
    from drafting import DatastoreSource

    ids = list(eval_prompts[0].token_ids)
    vocab = len(tokenizer)
    cases = [
        (lambda c: c.lookup(np.array(ids, dtype=float) + 0.9), "float64"),
        (lambda c: c.lookup("How do I"), "str"),
        (lambda c: c.lookup(b"\x01\x02"), "bytes"),
        (lambda c: c.lookup(i for i in ids), "generator"),
        (lambda c: c.lookup(ids[:-1] + [vocab]), str(vocab)),
        (lambda c: c.lookup(ids[:-1] + [-3]), "-3"),
        (lambda c: c.lookup(ids[:-1] + [True]), "True"),
        (lambda c: c.lookup(ids[:-1] + [2.0]), "2.0"),
        (lambda c: c.lookup_batch(ids), "flat"),
        (lambda c: c.lookup_batch(iter([ids])), "list_iterator"),
        (lambda c: c.lookup_batch("ab"), "str"),
        (lambda c: c.lookup_batch([ids, np.zeros((2, 2), np.int64)]), "contexts[1]"),
        (lambda c: c.candidates_batch([ids, ids[:-1] + [vocab + 5]]), "contexts[1]"),
        (lambda c: c.lookup_batch(np.ones((2, 4), dtype=np.float32)), "float32"),
    ]
    for open_ in (Datastore.open, SharedDatastore.open):
        with open_(chat_datastore, tokenizer=tokenizer, database_url=database_url) as client:
            assert client.lookup(ids) is not None and client.lookup(np.asarray(ids, dtype=np.int32)) is not None
            assert len(client.lookup_batch(np.asarray([ids[:8], ids[1:9]], dtype=np.int64))) == 2  # rows: contexts
            for call, named in cases:
                with pytest.raises(InvalidContext, match=re.escape(named)):
                    call(client)
    source = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    with pytest.raises(InvalidContext):  # a caller's bug is raised, never swallowed as a datastore fault
        source.lookup(np.array(ids, dtype=float))
    assert not source.faults
    source.close()
    with pytest.raises(BadDatabaseUrl, match="not-a-url"):
        Datastore.open(chat_datastore, tokenizer=tokenizer, database_url="not-a-url")


def test_a_context_is_checked_by_its_last_ids_whole_when_shorter():
    from datastore.context import check_context

    assert check_context([5, 6], 10, 5) == [5, 6] == check_context(np.array([5, 6], dtype=np.uint32), 10, 5)
    assert check_context((1, 2, 3, 4), 10, 2) == [3, 4] == check_context(np.arange(1, 5), 10, 2)
    assert check_context([], 10, 3) == [] == check_context([1, 2], 10, 0)
    with pytest.raises(InvalidContext, match="outside"):
        check_context([99, 1], 10, 5)  # the early id is inside the tail: checked
