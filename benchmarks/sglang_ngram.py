"""SGLang's NGRAM drafter as a replay peer: SGLang 0.5.23's own C++ (``sglang/kernels/jit/csrc/ngram_corpus``), run
the way its server runs it.

SGLang is the production engine that verifies n-gram drafts as trees. Its drafter keeps one trie of recent
n-grams shared by every request (``trie.cpp``; ``Trie::buildRecency``, l.220-264: the BFS mode, most recent
children first, breadth shrinking with depth; ``Trie::buildFrequency``, l.266-331: the PROB mode, a heap on
path probability), plus optional external corpora as suffix automata (``suffix_automaton.cpp``) that get a share
of the draft budget (``ngram.cpp``, ``Ngram::batchMatch``, l.144-207). Per decode step its worker
(``sglang/srt/speculative/ngram_worker.py``, ``_prepare_draft_tokens`` l.250-295 and ``_update_ngram_corpus``
l.396-420) matches the last ``max_trie_depth`` tokens of the request, drafts ``draft_token_num - 1`` nodes,
then inserts that same window into the trie (the prompt itself is never inserted whole: see its comment at l.403-407).

``bash scripts/setup-vllm.sh --sglang`` installs the ``sglang`` wheel (no dependencies) and ``apache-tvm-ffi``.
SGLang compiles the module at run time with its own JIT (``sglang/kernels/jit/utils/compile``: ninja, ``c++
-std=c++20 -O3``, linked to ``libtvm_ffi``, loaded by ``tvm_ffi.load_module``); its loader imports the server's
environment (torch, GPU detection), so :func:`load_module` runs the same compiler commands on the same five
sources, unmodified, and loads the result the same way (cached under ``~/.cache/crest-spec/sglang-ngram``).
Defaults are the server's (``sglang/srt/arg_groups/fields/spec.py`` l.250-283): trie depth 18, breadth 1..10,
external corpora of at most 10M tokens; the trie's capacity is 1M nodes (the server's 10M preallocates 2 GB, and a
replayed set inserts about 0.3M), which changes nothing here: no node is ever evicted.
"""

from __future__ import annotations

import importlib.util
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from drafting import Draft, ScoreKind, TokenDrafter
from toolkit.settings import Settings

SGLANG_VERSION = "0.5.23"
# the sources, in the order sglang/kernels/ops/speculative/ngram_corpus.py compiles them
SOURCES = ("ngram_corpus/result.cpp", "ngram_corpus/trie.cpp", "ngram_corpus/suffix_automaton.cpp",
           "ngram_corpus/ngram.cpp", "ngram_corpus/ngram_corpus_ffi.cpp")
SEPARATOR = -(2**31)  # SuffixAutomaton::kSeparatorToken: between the documents of an external corpus
MODES = {"BFS": 0, "PROB": 1}
_CLASS = None


def available() -> str | None:
    """``None`` when SGLang's drafter can run here, else what is missing (and the command that installs it)."""
    for module in ("sglang", "tvm_ffi"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (bash scripts/setup-vllm.sh --sglang)"
    return None


def _jit_dir() -> Path:
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed: bash scripts/setup-vllm.sh --sglang")
    return Path(next(iter(spec.submodule_search_locations))) / "kernels" / "jit"


def load_module(cache: Path | None = None) -> type:
    """Compile (once) and load SGLang's ``ngram_corpus`` module; returns its ``sgl.NgramCorpus`` class."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import tvm_ffi
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path, find_libtvm_ffi

    jit = _jit_dir()
    out_dir = cache or Settings.from_env().cache_dir / "sglang-ngram"
    so = out_dir / f"ngram_corpus-{SGLANG_VERSION}.so"
    sources = [jit / "csrc" / s for s in SOURCES]
    if not so.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        lib = Path(find_libtvm_ffi())
        flags = ["-fPIC", "-std=c++20", "-O3", f"-I{find_include_path()}", f"-I{find_dlpack_include_path()}",
                 f"-I{jit / 'include'}"]
        objects = []
        t0 = time.perf_counter()
        for i, src in enumerate(sources):
            obj = out_dir / f"{src.stem}_{i}.o"
            subprocess.run(["c++", *flags, "-c", str(src), "-o", str(obj)], check=True, capture_output=True)
            objects.append(str(obj))
        tmp = so.with_suffix(".tmp.so")
        subprocess.run(["c++", *objects, "-shared", f"-L{lib.parent}", f"-l{lib.stem.removeprefix('lib')}",
                        f"-Wl,-rpath,{lib.parent}", "-o", str(tmp)], check=True, capture_output=True)
        tmp.replace(so)
        print(f"compiled SGLang {SGLANG_VERSION}'s ngram_corpus in {time.perf_counter() - t0:.0f} s: {so}", flush=True)
    module = tvm_ffi.load_module(str(so))
    module.register_once()

    @tvm_ffi.register_object("sgl.NgramCorpus")
    class NgramCorpus(tvm_ffi.Object):  # as sglang/kernels/ops/speculative/ngram_corpus.py registers it
        __slots__ = ("__dict__",)

        def __init__(self, *args) -> None:
            self.__ffi_init__(*args)  # type: ignore[attr-defined, unused-ignore]  # tvm_ffi's reflection adds it

    _CLASS = NgramCorpus
    return _CLASS


class SGLangCorpus:
    """One SGLang ``NgramCorpus``: the shared trie (and external corpora) for a fixed number of draft nodes.

    Args:
        draft_nodes: draft nodes per request and step (SGLang's ``speculative_num_draft_tokens`` - 1).
        mode: ``BFS`` (recency) or ``PROB`` (frequency).
        max_trie_depth / min_bfs_breadth / max_bfs_breadth / capacity: SGLang's ``speculative_ngram_*`` settings.
        external_sam_budget: draft nodes given to the external corpora (0: none).
    """

    def __init__(self, draft_nodes: int, mode: str = "BFS", *, max_trie_depth: int = 18, min_bfs_breadth: int = 1,
                 max_bfs_breadth: int = 10, capacity: int = 1_000_000, external_sam_budget: int = 0,
                 external_corpus_max_tokens: int = 10_000_000) -> None:
        cls = load_module()
        self.d = draft_nodes + 1  # SGLang's draft token count includes the root (the last committed token)
        self.max_trie_depth, self.max_corpus_tokens = max_trie_depth, external_corpus_max_tokens
        self.obj = cls(capacity, max_trie_depth, min_bfs_breadth, max_bfs_breadth, self.d, MODES[mode],
                       external_sam_budget, external_corpus_max_tokens)

    def load_corpus(self, corpus_id: str, documents: Sequence[np.ndarray], chunk: int = 4096,
                    max_tokens: int = 10_000_000) -> int:
        """Build an external corpus's suffix automaton from token documents (as ``external_corpus.py`` chunks a
        corpus file: a separator before every document but the first, 4096-token chunks), the documents in order
        up to ``max_tokens`` (SGLang's ``external_corpus_max_tokens``: it refuses a larger corpus); returns the
        tokens loaded."""
        self.obj.start_external_corpus_load()
        pending: list[np.ndarray] = []
        held = total = 0
        for i, doc in enumerate(documents):
            part = np.asarray(doc, dtype=np.int32)
            if i:
                part = np.concatenate([np.array([SEPARATOR], dtype=np.int32), part])
            if total + held + len(part) > max_tokens:
                break
            pending.append(part)
            held += len(part)
            if held >= chunk:
                flat = np.concatenate(pending)
                for s in range(0, len(flat) - len(flat) % chunk, chunk):
                    self.obj.append_external_corpus_tokens(np.ascontiguousarray(flat[s:s + chunk]))
                rest = flat[len(flat) - len(flat) % chunk:]
                total += len(flat) - len(rest)
                pending, held = [rest], len(rest)
        if held:
            self.obj.append_external_corpus_tokens(np.ascontiguousarray(np.concatenate(pending)))
            total += held
        self.obj.finish_external_corpus_load(corpus_id)
        return total

    def match(self, state_id: int, window: Sequence[int], total_len: int) -> tuple[np.ndarray, np.ndarray]:
        """``Ngram::batchMatch`` for one request: ``(tokens [D] int32, mask [D, D] uint8)``."""
        self.obj.synchronize()
        tokens = np.zeros(self.d, dtype=np.int32)
        mask = np.zeros(self.d * self.d, dtype=np.uint8)
        self.obj.batch_match_stateful(np.array([state_id], np.int64), np.asarray(window, np.int32),
                                      np.array([0, len(window)], np.int64), np.array([total_len], np.int64),
                                      tokens, mask)
        return tokens, mask.reshape(self.d, self.d)

    def insert(self, window: Sequence[int]) -> None:
        """``Trie::insert`` of one window, asynchronously (SGLang's worker thread)."""
        self.obj.async_insert(np.asarray(window, np.int32), np.array([0, len(window)], np.int64))


def to_draft(tokens: np.ndarray, mask: np.ndarray) -> Draft:
    """SGLang's ``(tokens, mask)`` (node 0: the root; ``mask[i, j]``: ``j`` is ``i`` or an ancestor; padded with
    token 0 under the root, ``result.cpp`` l.34-38) as a :class:`Draft` without the root or the padding."""
    d = len(tokens)
    order = np.arange(d)
    below = mask.astype(bool) & (order[None, :] < order[:, None])
    parents = np.where(below.any(-1), (below * order).argmax(-1), -1)  # the nearest ancestor (_derive_tree_links)
    n = d
    has_child = np.zeros(d, dtype=bool)
    has_child[parents[parents >= 0]] = True
    while n > 1 and tokens[n - 1] == 0 and parents[n - 1] == 0 and not has_child[n - 1]:
        n -= 1
    return Draft(tokens[1:n].astype(np.int64), (parents[1:n] - 1).astype(np.int32), np.ones(n - 1), ScoreKind.NONE)


class SGLangDrafter(TokenDrafter):
    """SGLang's NGRAM drafter: each draft matches the request's last ``max_trie_depth`` tokens, then inserts them (its
    worker's order); the trie is shared by every request.

    Args:
        make: ``draft_nodes -> SGLangCorpus`` (one corpus per budget, built on first use; a replay uses one).
        name: the benchmark's label. vocab_size: as :class:`drafting.TokenDrafter`.
    """

    def __init__(self, make, name: str, *, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        self.make, self.name = make, name
        self.corpora: dict[int, SGLangCorpus] = {}
        self._ids = 0

    def started(self, prompt: np.ndarray) -> int:
        self._ids += 1
        return self._ids

    def stopped(self, state, tokens: list[int]) -> None:
        for corpus in self.corpora.values():
            corpus.obj.erase_match_state(np.array([state], np.int64))

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        corpus = self.corpora.get(budget)
        if corpus is None:
            corpus = self.corpora[budget] = self.make(budget)
        window = tokens[-corpus.max_trie_depth:]
        matched, mask = corpus.match(state, window, len(tokens))
        corpus.insert(window)
        draft = to_draft(matched, mask)
        return draft.best_path(budget) if chain else draft
