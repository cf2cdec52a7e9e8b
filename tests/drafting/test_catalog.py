"""The datastores a drafter's requests draft from (:mod:`drafting.catalog`), on the real Postgres: a name is opened the
first time a request names it (on a thread of its own; the request drafts from the shared datastore meanwhile); a name
off the operator's list, or one not built, drafts from the shared datastore, logged once per name, and fails nothing;
at most ``max_open`` stay open, the least recently named with no request closed first; ``close`` closes every one."""

from __future__ import annotations

import time
import uuid

import pytest

from datastore.shared import SharedDatastore
from drafting import DatastoreCatalog, DatastoreSource, DraftingService
from drafting.catalog import DEFAULT_SET
from support import build_small

VOCAB = 49_152


@pytest.fixture
def two_more(database_url, sharegpt_sample):
    """Three small datastores a request may name."""
    from datastore.admin.catalog import drop_datastore

    names = [f"test-named-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for name in names:
        build_small(database_url, name, sharegpt_sample)
    yield names
    for name in names:
        drop_datastore(database_url, name)


def _catalog(chat_datastore, database_url, tokenizer, allowed, max_open=8) -> DatastoreCatalog:
    def connect(name: str) -> SharedDatastore:
        return SharedDatastore.open(name, tokenizer=tokenizer, database_url=database_url, replicas=False)

    shared = DatastoreSource(lambda: connect(chat_datastore))
    return DatastoreCatalog(shared, chat_datastore, connect=connect, allowed=allowed, max_open=max_open)


def _opened(catalog: DatastoreCatalog, name: str, shared: bool = True, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (got := catalog.resolve(name, shared)) == DEFAULT_SET:
        assert time.monotonic() < deadline, f"{name} did not open"
        time.sleep(0.02)
    return got


def test_a_name_opens_on_first_use_and_its_sets_are_its_own(chat_datastore, database_url, tokenizer, two_more):
    catalog = _catalog(chat_datastore, database_url, tokenizer, two_more)
    a = two_more[0]
    assert catalog.resolve(None) == catalog.resolve(chat_datastore) == DEFAULT_SET  # the shared one alone
    assert catalog.resolve(a) == DEFAULT_SET  # still opening: the shared one meanwhile
    both, alone = _opened(catalog, a), _opened(catalog, a, shared=False)
    assert len({DEFAULT_SET, both, alone}) == 3
    assert catalog.members(both).first is not None and catalog.members(both).second is catalog.shared
    assert catalog.members(alone).second is None and catalog.members(alone).name == a
    assert (catalog.identity() or {})["named"] == [a]
    catalog.close()


def test_a_name_it_cannot_serve_drafts_from_the_shared_one_and_is_told_once(chat_datastore, database_url, tokenizer,
                                                                             two_more, eval_prompts, caplog):
    catalog = _catalog(chat_datastore, database_url, tokenizer, [*two_more, "never-built"])
    service = DraftingService(catalog, vocab_size=VOCAB)
    prompt = [int(t) for t in eval_prompts[0].token_ids]
    for i, name in enumerate(["off-the-list", "never-built"] * 3):
        service.start_request(i, prompt, datastore=name, shared=False)
        assert len(service.step([i], [8]).drafts) == 1  # drafts, from the shared datastore
        time.sleep(0.3)  # the not-built name's open is tried (once) on its own thread
    assert catalog.resolve("never-built") == catalog.resolve("off-the-list") == DEFAULT_SET
    assert caplog.text.count("'off-the-list' draft from the shared one") == 1
    assert caplog.text.count("'never-built' draft from the shared one") == 1
    with pytest.raises(TypeError, match="datastore=5 is a int"):
        service.start_request("x", prompt, datastore=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shared=1 is a int"):
        service.start_request("x", prompt, shared=1)  # type: ignore[arg-type]
    service.close()


def test_at_most_max_open_stay_open_and_a_datastore_in_use_is_never_closed(chat_datastore, database_url, tokenizer,
                                                                            two_more, eval_prompts):
    catalog = _catalog(chat_datastore, database_url, tokenizer, two_more, max_open=1)
    service = DraftingService(catalog, vocab_size=VOCAB)
    a, b, c = two_more
    prompt = [int(t) for t in eval_prompts[0].token_ids]
    _opened(catalog, a)
    service.start_request("on-a", prompt, datastore=a)  # a is in use
    _opened(catalog, b)  # b opens beside it: a stays open while its request drafts
    assert (catalog.identity() or {})["named"] == sorted([a, b])
    service.stop_request("on-a")
    _opened(catalog, c)  # a and b, named before c and drafted from by no request, are closed
    assert (catalog.identity() or {})["named"] == [c]
    assert catalog.resolve(a) == DEFAULT_SET  # closed: named again, it opens anew
    _opened(catalog, a)
    service.close()
    assert catalog.shared is not None and catalog.shared.client is None  # closed with the drafter
