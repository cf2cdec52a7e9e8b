"""The oracle's union of token trees (``tests/oracle/treeops.py``) against brute force on random trees."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from drafting.draft import Draft
from oracle import treeops
from support import tree_paths, trees


@settings(max_examples=200, deadline=None)
@given(trees(), trees(), trees())
def test_union_is_the_exact_union(a, b, c):
    kids = treeops.children(a.token_ids, a.parents)
    u = treeops.union(a.token_ids, a.parents, treeops.depths(a.parents), kids,
                      [(b.token_ids, b.parents), (c.token_ids, c.parents)])
    paths = tree_paths(Draft(u.tokens, u.parents, np.zeros(len(u.tokens))))
    assert len(set(paths)) == len(paths) == len(set(tree_paths(a)) | set(tree_paths(b)) | set(tree_paths(c)))
    assert paths[:len(a)] == tree_paths(a)                                  # the base first, in its order
    assert all(p < i for i, p in enumerate(u.parents.tolist()))             # parents first
    assert u.depths.tolist() == [len(q) for q in paths]
    for tree, where in zip((a, b, c), u.where):                             # each tree's nodes map to themselves
        assert [paths[w] for w in where.tolist()] == tree_paths(tree)
