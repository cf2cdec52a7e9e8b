// The drafting core: the merged drafter's request table and its step. A request is keyed by the caller's id and holds
// its tokens and their suffix automaton (stage 1); the core also holds this process's output index (stage 2). A step
// drafts each request of a batch from its sources: the caller's datastore candidates, live-layer tree and draft heads'
// tree (S4C), the request's own match and the output index's, merged (stage 3), featured (stage 4), scored (stage 5)
// and cut to a chain (stage 6) or a tree (stage 7); among the datastore's candidate n-grams (its stored suffixes of the
// context, longest first) the one whose draft has the largest expected accepted length wins (the back-off lookup).
//
// Not thread-safe: drafting.DraftingService holds one lock around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "automaton.hpp"
#include "cut.hpp"
#include "features.hpp"
#include "merge.hpp"
#include "output_index.hpp"
#include "scores.hpp"

namespace crest {

using RequestKey = std::variant<int64_t, std::string>;

struct Options {
  uint64_t vocab_size = 1ULL << 32;  // token ids are below this (checked where they enter)
  int local_depth = 16;          // the requests' automata's deepest continuation node
  int match_nodes = 64;          // nodes of the local and output matches (at least the budget)
  std::size_t outputs_bytes = 0;  // the output index's bound (0: off)
  int outputs_depth = 16;
  int context_tokens = 64;        // trailing tokens of a request matched against the outputs
  bool sources[kNumSources] = {true, true, true, true, true};  // the sources drafted from
};

// One request's inputs to a step: the datastore's candidate trees (longest n-gram first; empty: none), the live
// layer's tree and the draft heads' tree with its probabilities (size 0: none).
struct StepInput {
  RequestKey key;
  int budget = 0;
  std::vector<SourceTree> candidates;
  SourceTree live;
  SourceTree heads;
};

struct Drafted {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<double> scores;
  int64_t chosen = -1;  // the datastore candidate drafted from (-1: none)
  void clear() {
    tokens.clear();
    parents.clear();
    scores.clear();
    chosen = -1;
  }
};

// A merged node table with its features and scores, per datastore candidate (what fitting the calibration reads).
struct NodeTable {
  Union shape;
  std::vector<double> features;  // [size, kNumFeatures]
  std::vector<double> scores;
};

class Core {
 public:
  Core(Calibration calibration, Options options);

  void start(const RequestKey& key, const uint32_t* prompt, std::size_t n);  // invalid_argument: already active
  void extend(const RequestKey& key, const uint32_t* tokens, std::size_t n);  // out_of_range: not active
  bool follow(const RequestKey& key, const uint32_t* tokens, std::size_t n);  // extend when its tokens prefix these
  bool stop(const RequestKey& key, std::vector<uint32_t>& output);  // false: not active; else its output, indexed
  bool active(const RequestKey& key) const { return requests_.count(key) > 0; }
  std::vector<RequestKey> keys() const;

  // One step: a draft per input; a request not active (stopped meanwhile) gets an empty draft.
  void draft(const std::vector<StepInput>& inputs, bool chain, double min_score, std::vector<Drafted>& out);
  // The node table of every candidate (or of none) of one active request, as a step would merge it.
  void tables(const StepInput& input, std::vector<NodeTable>& out);

  const OutputIndex& outputs() const { return outputs_; }
  const Options& options() const { return options_; }

 private:
  struct Request {
    std::vector<uint32_t> tokens;
    std::size_t prompt_len = 0;
    Automaton automaton;
  };
  struct KeyHash {
    std::size_t operator()(const RequestKey& k) const { return std::hash<RequestKey>()(k); }
  };
  Request& get(const RequestKey& key);
  // The sources of one step but the datastore's: the live tree, the request's own match, the output index's and the
  // heads' tree.
  void gather(Request& r, const StepInput& in, int nodes);
  bool score_candidate(const SourceTree* candidate);
  void cut(bool chain, int budget, double min_score, Drafted& out);
  void draft_one(Request& r, const StepInput& in, bool chain, double min_score, Drafted& out);

  struct Scratch {  // one step's working arrays, kept between steps (their memory is reused)
    Tree local, earlier;
    SourceTree local_view, earlier_view;
    std::vector<const SourceTree*> sources;
    ChildMap children;
    Union merged;
    std::vector<double> x, score;
    std::vector<uint8_t> has_kids;
    CutScratch cut;
    std::vector<int32_t> picked, picked_parents;
    Drafted candidate;
  };

  Scratch z_;
  Calibration calibration_;
  Options options_;
  OutputIndex outputs_;
  std::unordered_map<RequestKey, Request, KeyHash> requests_;
};

}  // namespace crest
