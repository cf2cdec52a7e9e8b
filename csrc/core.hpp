// The drafting core: each request's suffix automaton, the process-wide index of finished outputs, and each step's
// calibrated merge of every source's tree, cut to a tree or the best chain. The native twin of decoder.core.PythonCore
// (decoder/local.py, decoder/output_index.py, decoder/calibration.py, decoder/treeops.py): the same arithmetic in the
// same order, so the same drafts, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "automaton.hpp"

namespace crest {

// A source's tree as the merge reads it (borrowed arrays).
struct SourceTree {
  int ngram_len = 0;
  const uint32_t* tokens = nullptr;
  const int32_t* parents = nullptr;
  const uint32_t* counts = nullptr;
  std::size_t size = 0;
  uint64_t root_count = 0;
};

// One request's inputs to a step: the datastore's candidates (longest first) and the live layer's match.
struct StepInput {
  int64_t handle = 0;
  int budget = 0;
  std::vector<SourceTree> candidates;
  bool has_live = false;
  SourceTree live;
};

struct Drafted {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<double> scores;
  int64_t chosen = -1;
  double local_s = 0.0;
  double merge_s = 0.0;
};

// Finished outputs in one generalised automaton, bounded in bytes; evicts in halves (decoder/output_index.py).
class OutputIndex {
 public:
  OutputIndex(std::size_t max_bytes, int max_depth) : max_bytes_(max_bytes), max_depth_(max_depth) {}
  void add(const std::vector<uint32_t>& tokens);
  // The longest suffix of `context` found, and its continuations; false when none.
  bool match(const uint32_t* context, std::size_t n, int budget, Tree& out, int& length) const;
  std::size_t nbytes() const { return automaton_.nbytes(); }
  std::size_t allocated() const {  // the automaton's arrays and the kept outputs, as allocated
    std::size_t kept = 0;
    for (const auto& o : outputs_) kept += o.capacity() * sizeof(uint32_t);
    return automaton_.allocated() + kept;
  }
  std::size_t num_outputs() const { return outputs_.size(); }
  std::size_t max_bytes() const { return max_bytes_; }
  int64_t evictions = 0;
  int64_t evicted = 0;

 private:
  void evict();
  std::size_t max_bytes_;
  int max_depth_;
  std::deque<std::vector<uint32_t>> outputs_;
  Automaton automaton_;
};

// (merged parent + 1, token) -> merged node, open addressing; reset per node table, memory kept.
class ChildMap {
 public:
  void reset(std::size_t capacity);
  int32_t* find_or_slot(int64_t parent, uint32_t token);  // the node's slot (-1: not there yet, fill it)

 private:
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  std::size_t mask_ = 0;
};

class Core {
 public:
  // coef: the calibration's weights (kNumFeatures), intercept, prior; local_depth: the requests' automata's deepest
  // continuation; match_nodes: nodes of the local and output matches (at least the budget); outputs_bytes: the
  // output index's bound (0: off); outputs_depth; context_tokens: trailing tokens matched against the outputs.
  Core(const std::vector<double>& coef, double intercept, double prior, int local_depth, int match_nodes,
       std::size_t outputs_bytes, int outputs_depth, int context_tokens);

  int64_t start(const std::vector<uint32_t>& prompt);
  void extend(int64_t handle, const std::vector<uint32_t>& tokens);
  std::vector<uint32_t> stop(int64_t handle);  // the output, added to the output index
  std::vector<uint32_t> context(int64_t handle, std::size_t n) const;  // the last n tokens
  std::vector<Drafted> draft(const std::vector<StepInput>& inputs, bool chain, double min_score);
  const OutputIndex& outputs() const { return outputs_; }
  std::size_t active() const { return requests_.size(); }

 private:
  struct Request {
    std::vector<uint32_t> tokens;
    std::size_t prompt_len = 0;
    Automaton automaton;
  };
  Request& get(int64_t handle);
  void draft_one(Request& req, const StepInput& in, bool chain, double min_score, Drafted& out);

  struct Scratch {  // one step's working arrays, kept between steps (their memory is reused)
    Tree local, earlier;
    std::vector<int64_t> mtok, path;
    std::vector<int32_t> mpar, mdepth, order, renumber;
    std::vector<double> x, score, sum;
    std::vector<uint8_t> has_kids, reached;
    std::vector<int32_t> where[4];
    ChildMap children;
    Drafted candidate;
  };

  Scratch scratch_;
  std::vector<double> coef_;
  double intercept_, prior_;
  int local_depth_, match_nodes_, context_tokens_;
  OutputIndex outputs_;
  std::unordered_map<int64_t, Request> requests_;
  int64_t next_handle_ = 1;
};

}  // namespace crest
