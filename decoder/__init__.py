"""The decoder: per-prompt n-gram trie, merged draft trees, tree-attention verification, benchmarks."""

from .budget import FixedBudget, LatencyCurve, choose_budget, load_or_measure, measure_latency
from .draft import Draft, merge_drafts, source_probabilities
from .drafters import (DatastoreDrafter, DatastoreSource, Drafter, MergedDrafter, NoDrafter, PromptLookupDrafter,
                       Proposal, RestDrafter, TrieDrafter)
from .generate import GenerationResult, StepRecord, greedy_generate, speculative_generate
from .model import TargetModel, load_target
from .ngram_trie import NGramTrie, TrieMatch
from .suffix_index import RestMatch, SuffixIndex
from .verify import accept_greedy, accept_sampled, keep_accepted_kv, tree_attention_inputs

__all__ = [
    "choose_budget", "FixedBudget", "LatencyCurve", "load_or_measure", "measure_latency", "Draft", "merge_drafts",
    "source_probabilities", "DatastoreDrafter", "DatastoreSource", "Drafter", "MergedDrafter", "NoDrafter",
    "PromptLookupDrafter", "Proposal", "RestDrafter", "TrieDrafter", "RestMatch", "SuffixIndex", "GenerationResult", "StepRecord", "greedy_generate",
    "speculative_generate", "TargetModel", "load_target", "NGramTrie", "TrieMatch", "accept_greedy",
    "accept_sampled", "keep_accepted_kv", "tree_attention_inputs",
]
