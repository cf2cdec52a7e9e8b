"""The local source: what a request's own tokens (its prompt and its output so far) predict.

A strategy object says how a request's tokens are indexed and matched; the merged drafter
(:class:`decoder.service.DraftingService`) starts one index per request and asks it for a match each step:

- :class:`SuffixMatching` (the default): a suffix automaton of the request's tokens
  (:mod:`decoder.suffix_automaton`) matches the longest earlier occurrence of the sequence's suffix, of any
  length, and counts its continuations (as SuffixDecoding's per-prompt suffix tree,
  https://arxiv.org/abs/2411.04975 §3, and SGLang's n-gram matcher do, without their depth limit);
- :class:`TrieMatching`: the N-Gram-Trie paper's sliding-window trie (https://openreview.net/forum?id=MVfpYw1pxX,
  §3.1-3.2), contexts of ``max_prefix`` tokens at most.

Each strategy names itself in :meth:`config`; the calibration records the one it was fitted with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Protocol

from datastore.tree import Match

from .ngram_trie import NGramTrie
from .suffix_automaton import SuffixAutomaton

__all__ = ["LocalIndex", "LocalStrategy", "SuffixMatching", "TrieMatching", "RequestAutomaton", "local_strategy"]


class LocalIndex(Protocol):
    """One request's index of its own tokens."""

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens."""

    def match(self, budget: int) -> Match | None:
        """The sequence's matched suffix and at most ``budget`` (>= 1) of its continuations, or ``None``."""


class LocalStrategy(Protocol):
    """How requests index their own tokens."""

    def new(self) -> LocalIndex:
        """An empty index for a new request."""

    def config(self) -> dict:
        """JSON-ready settings, ``kind`` first."""


class RequestAutomaton:
    """A request's suffix automaton: the longest repeated suffix of its tokens and that suffix's continuations.

    Args:
        max_depth: deepest continuation node, >= 1.
    """

    def __init__(self, max_depth: int) -> None:
        self.automaton = SuffixAutomaton()
        self.max_depth = max_depth
        self._tail: list[int] = []  # the tokens, to name the matched context

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens."""
        toks = [int(t) for t in tokens]
        self.automaton.extend(toks)
        self._tail += toks

    def match(self, budget: int) -> Match | None:
        """The longest suffix that occurred earlier (any length) and its most frequent continuations (the
        occurrence that ends the sequence is not counted), or ``None`` when none occurred or none continued.

        Raises:
            ValueError: when ``budget < 1``.
        """
        if budget < 1:
            raise ValueError(f"budget={budget}: must be >= 1")
        state, length = self.automaton.repeated_suffix()
        if length == 0:
            return None
        tree = self.automaton.continuations(state, budget, self.max_depth, own=1)
        return Match(tuple(self._tail[len(self._tail) - length:]), tree) if len(tree) else None


@dataclass(frozen=True)
class SuffixMatching:
    """Per-request suffix automata: contexts of any length (the default local source).

    Args:
        max_depth: deepest continuation node (draft depth), 1..64.

    Raises:
        ValueError: when ``max_depth`` is out of range.
    """

    max_depth: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.max_depth <= 64:
            raise ValueError(f"max_depth={self.max_depth}: must be in 1..64")

    def new(self) -> RequestAutomaton:
        """An empty automaton."""
        return RequestAutomaton(self.max_depth)

    def config(self) -> dict:
        """``{"kind": "suffix", "max_depth": ...}``."""
        return {"kind": "suffix", **asdict(self)}


@dataclass(frozen=True)
class TrieMatching:
    """Per-request N-gram tries (the N-Gram-Trie paper's sliding window).

    Args:
        window: the sliding window ``n``, 2..64. max_prefix: longest matched context ``Lp``, 1..window-1.

    Raises:
        ValueError: when an argument is out of range.
    """

    window: int = 13
    max_prefix: int = 3

    def __post_init__(self) -> None:
        NGramTrie(self.window, self.max_prefix)  # validates them

    def new(self) -> NGramTrie:
        """An empty trie."""
        return NGramTrie(self.window, self.max_prefix)

    def config(self) -> dict:
        """``{"kind": "trie", "window": ..., "max_prefix": ...}``."""
        return {"kind": "trie", **asdict(self)}


def local_strategy(config: dict) -> LocalStrategy:
    """The strategy a :meth:`LocalStrategy.config` dict describes.

    Raises:
        ValueError: for an unknown ``kind`` or setting.
    """
    settings = {k: v for k, v in config.items() if k != "kind"}
    kinds: dict[str, type] = {"suffix": SuffixMatching, "trie": TrieMatching}
    kind = config.get("kind")
    if kind not in kinds:
        raise ValueError(f"local source kind {kind!r}: must be one of {sorted(kinds)}")
    try:
        return kinds[kind](**settings)
    except TypeError as exc:
        raise ValueError(f"local source {config}: {exc}") from None
