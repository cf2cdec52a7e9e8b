// Stage 2 of drafting: the process-wide index of finished outputs. Every output this process generated is draftable
// from the next request on, as SuffixDecoding's global suffix tree of earlier responses (Oliaro et al. 2024,
// https://arxiv.org/abs/2411.04975, section 3); here one generalised suffix automaton, bounded in bytes. An automaton
// cannot forget one sequence, so the index evicts in halves: past its bound it keeps the newest outputs that fit in
// half of it and rebuilds from them. Its Python oracle is tests/oracle/output_index.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "automaton.hpp"

namespace crest {

// Where a request's last tokens match the index, kept between steps: advanced by its new tokens while the index is the
// same (`version`), matched afresh when it changed.
struct OutputMatch {
  uint64_t version = ~0ULL;
  std::size_t pos = 0;  // tokens of the request matched
  int32_t state = 0, length = 0;
};

class OutputIndex {
 public:
  // max_bytes: the bound on the automaton's size model (0: keep nothing); max_depth: deepest continuation node.
  OutputIndex(std::size_t max_bytes, int max_depth) : max_bytes_(max_bytes), max_depth_(max_depth) {}
  void add(const std::vector<uint32_t>& tokens);
  // The longest suffix of `context` found and at most `budget` of its continuations; false when none.
  bool match(const uint32_t* context, std::size_t n, int budget, Tree& out, int& length) const;
  // The same, for the last `window` of a request's `n` tokens, advancing `m` over the tokens it has not matched (an
  // automaton's match of a text depends only on the text: the longest suffix found, clamped to the window, is that of
  // the window's).
  bool follow(OutputMatch& m, const uint32_t* tokens, std::size_t n, std::size_t window, int budget, Tree& out,
              int& length) const;
  uint64_t version() const { return version_; }
  std::size_t nbytes() const { return automaton_.nbytes(); }
  std::size_t allocated() const;  // the automaton's arrays and the kept outputs, as allocated
  std::size_t num_outputs() const { return outputs_.size(); }
  std::size_t max_bytes() const { return max_bytes_; }
  int max_depth() const { return max_depth_; }
  int64_t evictions = 0;
  int64_t evicted = 0;

 private:
  void evict();
  std::size_t max_bytes_;
  int max_depth_;
  std::deque<std::vector<uint32_t>> outputs_;
  Automaton automaton_;
  uint64_t version_ = 0;  // changes with the automaton
};

}  // namespace crest
