"""Research: what measures and explores the drafter, not the product (the wheel ships none of it). Each finding is
written up in ``docs/`` (``docs/drafter-quality.md``, ``docs/studies.md``, ``docs/history/``); the code stays where
someone would run it again:

- :mod:`research.study`: the storage study and the corpus-size study (``python -m research.study``);
- :mod:`research.hf_bench`: the HF loop's benchmark and replay of the papers' drafters (``python -m
research.hf_bench``);
- :mod:`research.drafters`: the papers' own drafters (the N-Gram-Trie's trie, no draft);
- :mod:`research.s4c`: S4C's draft heads and their training (``python -m research.s4c``);
- :mod:`research.experiments`: the ranking headroom of the union, the cut on a simulated engine, the oracle cut, the
  distilled-corpus curve.
"""
