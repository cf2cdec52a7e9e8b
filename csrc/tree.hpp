// Flat token trees: a counted continuation tree a source owns, and the borrowed view the merge reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace crest {

// A counted continuation tree in flat form: parents[i] < i, -1 for a child of the root; counts never rise along a
// path; root_count: occurrences of the matched context (0: unknown, the root's children's counts stand in).
struct Tree {
  std::vector<uint32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<uint32_t> counts;
  uint64_t root_count = 0;
  void clear() {
    tokens.clear();
    parents.clear();
    counts.clear();
    root_count = 0;
  }
};

// One source's tree as a step reads it (borrowed arrays) and the length of the context it matched.
struct SourceTree {
  int ngram_len = 0;
  const uint32_t* tokens = nullptr;
  const int32_t* parents = nullptr;
  const uint32_t* counts = nullptr;
  std::size_t size = 0;
  uint64_t root_count = 0;

  static SourceTree of(const Tree& t, int ngram_len) {
    return {ngram_len, t.tokens.data(), t.parents.data(), t.counts.data(), t.tokens.size(), t.root_count};
  }
};

}  // namespace crest
