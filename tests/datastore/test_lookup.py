"""The lookup core (:mod:`datastore.lookup`) on a real datastore: the back-off lookup's candidates are every stored
suffix, longest first, on both clients; a drafting step's lookups (the datastore's and its live layer's) are one
round trip."""

from __future__ import annotations

from datastore import Datastore, SharedDatastore


def test_candidates_are_every_stored_suffix_longest_first(chat_datastore, database_url, tokenizer, eval_prompts):
    plain = Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url)
    shared = SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url)
    try:
        contexts = [list(p.token_ids[:k]) for p in eval_prompts for k in range(4, len(p.token_ids), 7)]
        want = []
        for ctx in contexts:  # oracle: the n-suffix is stored when the longest match of that suffix has length n
            hits = [plain.lookup(ctx[-n:]) for n in range(plain.info.max_n, 0, -1)]
            want.append([(m.ngram, m.tree) for n, m in zip(range(plain.info.max_n, 0, -1), hits)
                         if m is not None and len(m.ngram) == n])
        assert sum(map(len, want)) > len(contexts)  # several candidates per context, typically
        for client in (plain, shared, shared):  # the second shared call is answered by its cache
            got = client.candidates_batch(contexts)
            assert [[(m.ngram, m.tree) for m in c] for c in got] == want
        assert [c[0].ngram if c else None for c in shared.candidates_batch(contexts)] == [
            None if m is None else m.ngram for m in shared.lookup_batch(contexts)]
    finally:
        plain.close()
        shared.close()
