// Stage 1 of drafting: the suffix automaton of token sequences with occurrence counts (Blumer et al. 1985; generalised
// to several sequences, as the output index shares one). A request's automaton of its own tokens answers its
// longest repeated suffix (of any length) and that suffix's counted continuations, as SuffixDecoding's per-request
// suffix tree does (Oliaro et al. 2024, https://arxiv.org/abs/2411.04975, section 3). Its Python oracle is
// tests/oracle/suffix_automaton.py: the same construction, the same states in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tree.hpp"

namespace crest {

// Bytes per state, transition and kept token: the size model the output index is bounded by.
constexpr std::size_t kStateBytes = 16;
constexpr std::size_t kTransitionBytes = 24;
constexpr std::size_t kTokenBytes = 4;

class Automaton {
 public:
  Automaton();

  // Begin a new sequence: later tokens extend it, never the previous one.
  void start_sequence() { last_ = 0; }
  // Append tokens (>= 0) to the current sequence.
  void extend(const uint32_t* tokens, std::size_t n);
  // (state, length) of the longest suffix of the current sequence that also occurs earlier; (0, 0): none.
  std::pair<int32_t, int32_t> repeated_suffix() const;
  // (state, length) of the longest suffix of `context` that occurs in the sequences; (0, 0): none. The state is the one
  // holding that suffix (a transition maps every string of a state to the same state).
  std::pair<int32_t, int32_t> match(const uint32_t* context, std::size_t n) const;
  // One token of that match: (state, matched) of a text becomes that of the text followed by `token`.
  void step(int32_t& state, int32_t& matched, uint32_t token) const;
  // The match of the text's last `max_len` tokens, from the match of the text: the state holding the suffix of
  // `max_len` tokens, when the match is longer.
  void clamp(int32_t& state, int32_t& matched, int32_t max_len) const;
  // The most frequent continuations below `state`, best-first (count desc; ties: earlier parent, smaller
  // token), at most `budget` nodes no deeper than `max_depth`; root_count: occurrences less `own`.
  void continuations(int32_t state, int budget, int max_depth, uint32_t own, Tree& out) const;

  std::size_t num_states() const { return states_.size(); }
  std::size_t num_transitions() const { return edges_.size(); }
  std::size_t num_tokens() const { return num_tokens_; }
  std::size_t nbytes() const {
    return kStateBytes * num_states() + kTransitionBytes * num_transitions() + kTokenBytes * num_tokens_;
  }
  // What the automaton's arrays hold allocated now, bytes (capacities: up to twice what nbytes models).
  std::size_t allocated() const {
    return states_.capacity() * sizeof(State) + edges_.capacity() * sizeof(Edge) + table_.capacity() * sizeof(int32_t);
  }

 private:
  struct State {
    int32_t len;
    int32_t link;
    uint32_t count;
    int32_t head;  // first outgoing edge, -1: none
  };
  struct Edge {
    int32_t from;
    uint32_t token;
    int32_t target;
    int32_t next;  // the next edge of the same state, -1: last
  };

  int32_t find(int32_t state, uint32_t token) const;  // edge index or -1
  void add_edge(int32_t state, uint32_t token, int32_t target);
  int32_t new_state(int32_t len, int32_t link, uint32_t count);
  int32_t clone(int32_t p, int32_t q, uint32_t token);
  void grow_table();
  std::size_t slot(int32_t state, uint32_t token) const;

  std::vector<State> states_;
  std::vector<Edge> edges_;
  std::vector<int32_t> table_;  // open addressing over edges_, keyed by (from, token); -1: empty
  std::size_t mask_ = 0;
  int32_t last_ = 0;
  std::size_t num_tokens_ = 0;
};

}  // namespace crest
