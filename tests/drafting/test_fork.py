"""A drafting process that forks (servers fork workers: gunicorn, multiprocessing, an engine's helpers) while another
of its threads drafts: the child never deadlocks and drafts on its own connections (the datastore's drafts within
seconds), and the parent's connections are never touched (its next round trip drafts as before, with no fault).
Real Postgres, a real build, real tokens."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from datastore.shared import SharedDatastore
from drafting import DatastoreSource, DraftingService

VOCAB = 49_152


def _child(service: DraftingService, batch, want, direct: SharedDatastore) -> int:
    """In the child: close the inherited client (what a worker's exit does), then draft until the drafts are the
    parent's (the datastore reopened here), within 20 s."""
    direct.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = [d.token_ids.tolist() for d in service.step(*batch).drafts]
        if got == want:
            return 0
        time.sleep(0.05)
    return 1


@pytest.mark.parametrize("replicas", [False, True], ids=["round trip", "replica"])
def test_a_child_forked_while_a_thread_drafts_drafts_and_leaves_the_parent_alone(replicas, chat_datastore,
                                                                               database_url, tokenizer, eval_prompts,
                                                                               tmp_path):
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url,
                                                          replicas=tmp_path if replicas else False),
                             reopen_in_background=True)
    service = DraftingService(source, vocab_size=VOCAB)
    direct = SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url, replicas=False,
                                  listen=False, cache_bytes=0)  # every lookup a query on its pooled connection
    contexts = [list(map(int, p.token_ids[:30])) for p in eval_prompts]
    found = direct.lookup_batch(contexts)
    try:
        if replicas:
            client = source.client
            assert isinstance(client, SharedDatastore) and client.replicas is not None
            assert client.replicas.wait_ready(60)
        for i, p in enumerate(eval_prompts):
            service.start_request(i, np.asarray(p.token_ids[:40]))
        batch = (list(range(len(eval_prompts))), [16] * len(eval_prompts))
        want = [d.token_ids.tolist() for d in service.step(*batch).drafts]
        assert any(want)
        stop = threading.Event()
        steps = [0]

        def drafting() -> None:
            while not stop.is_set():
                service.step(*batch)
                steps[0] += 1

        thread = threading.Thread(target=drafting)
        thread.start()
        try:
            for _ in range(3):
                time.sleep(0.05)
                pid = os.fork()
                if pid == 0:  # the child: no pytest teardown runs here
                    code = 2
                    try:
                        code = _child(service, batch, want, direct)
                    finally:
                        os._exit(code)
                deadline = time.monotonic() + 40
                while True:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        break
                    if time.monotonic() > deadline:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        raise AssertionError("the forked child hung (deadlocked)")
                    time.sleep(0.05)
                assert os.waitstatus_to_exitcode(status) == 0
        finally:
            stop.set()
            thread.join()
        assert steps[0] > 0
        assert [d.token_ids.tolist() for d in service.step(*batch).drafts] == want  # the parent's session is intact
        assert not source.faults, source.faults
        again = direct.lookup_batch(contexts)  # the children closed their copies: the parent's session is intact
        assert [m and m.tree.token_ids.tolist() for m in again] == [m and m.tree.token_ids.tolist() for m in found]
    finally:
        service.close()
        direct.close()
