"""``python -m live``: bad input is refused at the door (exit 2), naming the input and the fix."""

from __future__ import annotations

import pytest

from support import check_refusal

LIVE = [
    (["compact", "--name", "a b"], 2, ("'a b'",)),
    (["compact", "--max-bytes", "12"], 2, ("'12'", "--max-bytes", "1024")),
    (["compact", "--top-t", "0"], 2, ("'0'", "--top-t")),
]


@pytest.mark.parametrize("argv,code,names", LIVE, ids=[" ".join(a) for a, _, _ in LIVE])
def test_live_compact_refuses_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from live.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    check_refusal(main, argv, code, names, capsys)
