// The drafting core: the merged drafter's request table and its step. A request (a handle: a slot of the table and its
// generation) holds its tokens and their suffix automaton (stage 1); the core also holds this process's output index
// (stage 2). A step drafts each request of a batch from its sources: the datastore's candidate trees and the live
// layer's tree, which a Retrieval strategy supplies (a host-local replica probed here with the request's last tokens,
// or the trees a round trip fetched), the request's own match and the output index's, merged (stage 3), featured (stage 4), scored (stage 5) and cut to a chain (stage 6) or a tree (stage 7); among the
// datastore's candidate n-grams (its stored suffixes of the context, longest first) the one whose draft has the
// largest expected accepted length wins (the back-off lookup, for trees of at least `back_off_min_budget` nodes).
// Each request keeps its last draft until its next tokens come, which judge it (csrc/feedback.hpp): an engine's chains
// can then be cut to its step-cost curve with each request's scores discounted by what the engine accepted.
//
// A step's arguments are checked once: what Python types (request ids, token lists) by drafting.door, the arrays an
// engine hands over (rows, counts, budgets) here, by Core::step, before anything changes. Not thread-safe:
// drafting.DraftingService holds one lock around every call (a step runs with the GIL released).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "automaton.hpp"
#include "cut.hpp"
#include "features.hpp"
#include "feedback.hpp"
#include "goodput.hpp"
#include "head.hpp"
#include "merge.hpp"
#include "online.hpp"
#include "output_index.hpp"
#include "replica.hpp"
#include "scores.hpp"

namespace crest {

constexpr int kMaxBudget = 1024;  // the largest budget (draft nodes of one request in one step): the one limit
constexpr std::size_t kTailTokens = 32;  // trailing tokens of each row a round trip looks up (keys: at most 31)

// The core's settings; the defaults are written here once (crest_native.Core's keyword arguments).
struct Options {
  int local_depth = 16;                             // the requests' automata's deepest continuation node
  int match_nodes = 64;                             // nodes of the local and output matches (at least the budget)
  std::size_t outputs_bytes = std::size_t(64) << 20;  // the output index's bound (0: off)
  int outputs_depth = 16;                           // the output index's deepest continuation node
  int context_tokens = 64;                          // trailing tokens of a request matched against the outputs
  int back_off_min_budget = 32;                     // trees of at least this budget choose among every stored suffix
  int max_tokens = 0;  // an engine's context length: a request's draft is cut to what fits beside its tokens and the
                       // bonus token (tokens + draft + 1 <= max_tokens; 0: no bound)
  bool sources[kNumSources] = {true, true, true, true};  // the sources drafted from
  // the calibration fitted online on the engine's verdicts, per datastore set (online.hpp): the prior's weight in
  // outcomes' worth of Fisher information (0: off, the calibration stays as given; 10 and 20,000 chosen on the fit
  // halves of Spec-Bench, HumanEval and BFCL), the outcomes after which one weighs 1/e, the outcomes between Newton
  // steps, and the most outcomes a set keeps between two folds into the fleet's fit (0: none, no fleet)
  double online_strength = 10.0;
  double online_memory = 20000.0;
  int online_refit = 64;
  int64_t online_share = 0;
};

using Handle = int64_t;  // a request: (generation << 32) | slot

// One row's datastore candidates (longest n-gram first; empty: none) and the live layer's trees, its main build's and its
// delta's (size 0: none; crest::live_layer reads the two as one source), borrowed.
struct Retrieved {
  std::vector<SourceTree> candidates;
  SourceTree live, delta;
};

// Which datastores a request drafts from: an index into the step's datastore sets (StoredTrees), chosen when the
// request starts (Core::start). A core serving one datastore has one set, 0.
using SetId = int32_t;

// Where a step's datastore and live-layer trees come from: a strategy.
class Retrieval {
 public:
  virtual ~Retrieval() = default;
  // Row `row`'s trees, for a request of datastore set `set` whose tokens are tokens[0..n); every stored suffix when
  // `back_off`, else the longest (of each of the set's datastores). False: the store is damaged (the step is to be
  // drafted another way).
  virtual bool retrieve(std::size_t row, SetId set, const uint32_t* tokens, std::size_t n, bool back_off,
                        Retrieved& out) = 0;
  // A hint that row `row` (tokens[0..n)) will be retrieved this step: a strategy that reads memory may start fetching
  // it, so that the rows' misses overlap. Nothing is read or checked.
  virtual void prefetch(std::size_t /*row*/, SetId /*set*/, const uint32_t* /*tokens*/, std::size_t /*n*/) {}
  int damaged = -1;  // the store found damaged (a read failed its check or the file was cut short), by its index
};

// The trees the caller fetched, per row (a round trip's answer; its arrays borrowed), each looked up for a request of
// planned[row] tokens (Core::plan's StepOutput::planned). A row whose request holds another count now (another thread
// followed it between the plan and the draft) is not drafted from them: retrieve answers false with `stale` set, and
// the step plans again (a context's draft never joins lookups made for another context).
class GivenTrees final : public Retrieval {
 public:
  std::vector<Retrieved> rows;
  std::vector<uint64_t> planned;  // [rows], or empty: not checked
  bool stale = false;
  bool retrieve(std::size_t row, SetId, const uint32_t*, std::size_t n, bool, Retrieved& out) override {
    if (!planned.empty() && planned[row] != n) {
      stale = true;
      return false;
    }
    out = rows[row];
    return true;
  }
};

// A datastore set's host-local replicas, by kind (nullptr: none): its datastores' (a request's own, then the shared
// one), and the live layer's main build's and delta's (of its first datastore).
constexpr int kStoreKinds = 4;
struct StoreSet {
  const Replica* stores[kStoreKinds] = {nullptr, nullptr, nullptr, nullptr};  // datastore, datastore, live, delta
};

// What a StoredTrees decodes into, kept between steps (its memory is reused): per store kind, one tree per stored
// suffix a row retrieves, and the record a probe copies out of the file.
struct StoredScratch {
  std::vector<Tree> trees[kStoreKinds];
  std::vector<uint8_t> record;
};

// The trees of host-local replicas, probed with the last tokens of each request, from its set's stores: each
// datastore's stored lengths, longest first (the first datastore's candidates, then the second's), and the live
// layer's. A store found damaged is named by set * kStoreKinds + kind.
class StoredTrees final : public Retrieval {
 public:
  StoredTrees(const StoreSet* sets, std::size_t num_sets, StoredScratch* scratch);
  bool retrieve(std::size_t row, SetId set, const uint32_t* tokens, std::size_t n, bool back_off,
                Retrieved& out) override;
  void prefetch(std::size_t row, SetId set, const uint32_t* tokens, std::size_t n) override;

 private:
  const StoreSet* sets_;
  std::size_t num_sets_;
  StoredScratch* scratch_;
  std::vector<int> lengths_;
};

struct Drafted {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<double> scores;
  std::vector<uint8_t> sources;  // per node, the sources whose trees hold it: bit k for Source k (holders)
  int64_t chosen = -1;           // the datastore candidate drafted from (-1: none)
  void clear() {
    tokens.clear();
    parents.clear();
    scores.clear();
    sources.clear();
    chosen = -1;
  }
};

// A merged node table with its features and scores, per datastore candidate (what fitting the calibration reads).
struct NodeTable {
  Union shape;
  std::vector<double> features;  // [size, kNumFeatures]
  std::vector<double> scores;
};

// An engine's rows as a step follows them (borrowed): row r holds rows[r * width ...], lengths[r] of its ids (T: int32
// or int64). Pair i of the step is on row index[i] (index empty: row i).
struct EngineRows {
  const void* rows = nullptr;
  const void* lengths = nullptr;
  bool wide = false;  // int64 ids (else int32)
  std::size_t num_rows = 0, width = 0;
  const int64_t* index = nullptr;  // [pairs], or nullptr
  int64_t limit = 0;               // new ids must be below it
};

// One step: each pair's request (handles[i]) follows its new tokens (an engine's rows, or `appended`: counts[i] tokens
// for pair i, end to end), then, when every pair followed, is drafted for (budgets[i] nodes, a chain or a tree, nodes
// scoring below min_score left out), the chains cut to the batch's goodput on `curve` when one is given.
struct StepInput {
  std::vector<Handle> handles;
  std::vector<int64_t> budgets;
  bool chain = false;
  double min_score = 0.0;
  const StepCurve* curve = nullptr;
  const EngineRows* rows = nullptr;
  const uint32_t* appended = nullptr;  // with counts: [sum(counts)] tokens
  const int64_t* counts = nullptr;     // [pairs]
  uint64_t key_limit = uint64_t{1} << 32;  // a plan asks only for tokens after the last id of at least this
  // [pairs, d] float32: each pair's state (Core::set_model: its head's input, or the next-state estimate itself where
  // the core has no head; nullptr: none), read where has_state[i]
  const float* states = nullptr;
  const uint8_t* has_state = nullptr;  // [pairs]
};

// What a step did: which pairs followed (all, or none when pair `bad` holds a new id outside [0, limit), that id in
// bad_id; a pair whose request is not active, stopped meanwhile, counts as followed and drafts nothing); whether it
// drafted (every pair followed and the retrieval's store was intact: else `damaged` names it); the drafts, or, for a
// step without a retrieval or whose given trees were looked up for another context of a row (GivenTrees::stale), what
// a round trip must fetch (back_off, tails, and each row's token count they are for: Core::plan).
struct StepOutput {
  std::vector<uint8_t> followed;
  int64_t bad = -1, bad_id = 0;
  bool drafted = false, planned = false;
  int damaged = -1;
  int64_t inactive = 0;  // rows whose request was not active (stopped meanwhile: an empty draft)
  std::vector<Drafted> drafts;
  std::vector<uint8_t> back_off;
  std::vector<std::vector<uint32_t>> tails;
  std::vector<uint64_t> counts;  // with a plan: each row's token count the tails were taken from (GivenTrees::planned)
  std::vector<SetId> sets;       // with a plan: each row's datastore set (-1: not active)
  // an engine step (Core::engine_step): each pair's handle (started ones' new handles), and the outputs of the
  // requests it stopped, in the order of its stops (empty: a stop of a request not active)
  std::vector<Handle> handles;
  std::vector<std::vector<uint32_t>> outputs;
  int64_t resynced = 0;  // pairs whose row did not extend what their request held: started again from the row
};

constexpr Handle kStart = -2;  // an engine step's pair that starts a new request from its row

// An engine's step by request id (Core::engine_step): stop the requests that finished, start the new ones from their
// rows, follow every other pair's row, then draft (as StepInput drafts). The engine's rows are read in place.
struct EngineInput {
  std::vector<Handle> handles;       // [pairs]: each pair's request, or kStart
  const SetId* sets = nullptr;       // [pairs]: the datastore set of each kStart pair
  std::vector<Handle> stops;         // requests that finished: stopped first (one not active is ignored)
  EngineRows rows;                   // the engine's rows; pair i on row index[i] (index nullptr: row i)
  std::vector<int64_t> budgets;      // [pairs]
  bool chain = false;
  double min_score = 0.0;
  const StepCurve* curve = nullptr;
  uint64_t key_limit = uint64_t{1} << 32;
  const float* states = nullptr;     // as StepInput's
  const uint8_t* has_state = nullptr;
};

class Core {
 public:
  Core(Calibration calibration, Options options);

  // The target's LM head ([vocab, d] float32, borrowed: the caller keeps it alive while the core lives), the
  // calibration that weighs the model features beside the others (kNumFeatures + kNumModelFeatures weights, the same
  // prior), and the draft head (head.hpp; nullptr: none). A row given a state is scored with it: with a head, the state
  // is the target's at the row's last accepted token and the head's estimate from it and the row's last token (its
  // bonus token) is read (a row whose last token has no row in the head's embedding is scored as one without a
  // state); without one, the state given is read as the next-state estimate itself. Any other row is
  // scored with the core's calibration, as before. Throws std::invalid_argument for another number of weights or
  // prior, an empty LM head, or a head of another width or a malformed one.
  void set_model(Calibration with_model, ModelView view, std::shared_ptr<const Head> head = nullptr);
  std::size_t model_width() const { return model_.lm_head ? model_.d : 0; }  // d, or 0 without a model

  // A new request from its prompt, drafting from datastore set `set` (>= 0).
  Handle start(const uint32_t* prompt, std::size_t n, SetId set = 0);
  // An engine's step by request id (EngineInput): stops, starts and follows, then drafts from `retrieval` (nullptr:
  // plans what a round trip must fetch, as step does; the draft is then a step of out.handles without rows). A pair
  // whose row holds a new id outside [0, limit) follows nothing and drafts nothing (followed 0; the others go on); a
  // pair whose row does not extend what its request holds is started again from its row (resynced). Throws
  // std::invalid_argument, naming the input and the fix, for budgets, rows, lengths, an index or sets an engine
  // cannot mean (nothing changed).
  void engine_step(const EngineInput& in, Retrieval* retrieval, StepOutput& out);
  // A step (StepInput): follow, then draft from `retrieval` (nullptr: only plan what a round trip must fetch). Throws
  // std::invalid_argument, naming the input and the fix, for budgets, rows, counts or an index an engine cannot mean
  // (nothing changed), and for a curve given to trees.
  void step(const StepInput& in, Retrieval* retrieval, StepOutput& out);
  // Pairs i < pairs: where request handles[i]'s tokens are the first of row index[i] of `rows` ([num_rows, width], each
  // row's count in `lengths`), its request takes the rest of the row; a pair whose row or request an earlier pair of
  // the call followed is skipped (each row holds one request, each request one row). Every new id must be in
  // [0, limit): otherwise nothing is followed and the first such pair is returned (its id in `bad_id`); -1 when every
  // pair was done. followed[i]: whether pair i followed. T: int32_t or int64_t (rows and lengths checked by the
  // caller).
  template <class T>
  int64_t follow_rows(const Handle* handles, const T* rows, std::size_t num_rows, std::size_t width,
                      const int64_t* index, const T* lengths, std::size_t pairs, int64_t limit, uint8_t* followed,
                      int64_t* bad_id);
  // Cut a step's chains (out[i]: request handles[i]'s) to the batch's goodput-best nodes on `curve`, each request's
  // scores discounted by its acceptance ratio (goodput_keep, discount_chain); a chain's kept nodes are a prefix.
  void cut_to_curve(const std::vector<Handle>& handles, const StepCurve& curve, std::vector<Drafted>& out);
  // A request's acceptance ratio (accepted over expected tokens of its judged drafts, shrunk towards the core's);
  // -1 when it is not active.
  double acceptance(Handle h) const;
  bool stop(Handle h, std::vector<uint32_t>& output);  // false: not active; else its output, indexed
  // Outputs finished elsewhere (another process of the fleet, an earlier run) into the output index, as a stopped
  // request's: output i is tokens[offsets[i] : offsets[i] + lengths[i]], laid end to end (n outputs, an empty one
  // skipped). Throws std::invalid_argument when the lengths do not add up to `num_tokens`.
  void add_outputs(const uint32_t* tokens, std::size_t num_tokens, const int64_t* lengths, std::size_t n);
  bool active(Handle h) const { return find(h) != nullptr; }
  std::size_t size() const { return slots_.size() - free_.size(); }
  std::size_t count(Handle h) const;  // its tokens (0: not active)
  void tokens(Handle h, std::size_t from, std::vector<uint32_t>& out) const;  // tokens[from:] of an active request

  SetId set_of(Handle h) const;  // its datastore set (-1: not active)
  // Datastore set `set`'s calibration now (with the model features: `with_model`; the one given, until the engine's
  // verdicts refit it) and the outcomes it learnt from (0 while online learning is off).
  const Calibration& calibration_of(SetId set, bool with_model);
  int64_t outcomes_of(SetId set, bool with_model);
  int64_t unshared_of(SetId set, bool with_model);  // outcomes learnt but not kept for a fold
  // Fold set `set`'s outcomes since its last fold into the fleet's learner `fleet` (its state; nullptr: none yet) and
  // go on from the result, returned (online.hpp). Throws std::invalid_argument for a state that is not one of this
  // set's fit, or while online learning is off.
  std::string fold(SetId set, bool with_model, const std::string* fleet);
  // Set `set` is to draft for another datastore (its id reused): its fits start again from the prior.
  void forget(SetId set);
  // A draft per row; a request not active (stopped meanwhile) or a budget of 0 gets an empty draft. False when the
  // retrieval found its store damaged (no drafts).
  // states/has_state: as StepInput's.
  bool draft(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, Retrieval& retrieval, bool chain,
             double min_score, std::vector<Drafted>& out, const float* states = nullptr,
             const uint8_t* has_state = nullptr);
  // What a round trip must fetch for each row: whether it backs off, and its last `tail` tokens after the last id of
  // at least `limit` (none for a row that drafts nothing).
  // counts[i]: row i's token count (0: not active).
  void plan(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, bool chain, std::size_t tail,
            uint64_t limit, std::vector<uint8_t>& back_off, std::vector<std::vector<uint32_t>>& tails,
            std::vector<uint64_t>& counts, std::vector<SetId>& sets) const;
  // The node table of every candidate (or of none) of one active request, as a step would merge it; given a
  // state `state` ([d]: a model is set; read as a step reads a row's, through the head where there is one), its features are followed by the model features
  // ([size, kNumFeatures + kNumModelFeatures]) and scored with the with-model calibration.
  void tables(Handle h, const Retrieved& given, std::vector<NodeTable>& out, const float* state = nullptr);

  const OutputIndex& outputs() const { return outputs_; }
  StoredScratch* retrieval_scratch() { return &z_.stored; }
  const Options& options() const { return options_; }

 private:
  struct Request {
    std::vector<uint32_t> tokens;
    std::size_t prompt_len = 0;
    Automaton automaton;
    OutputMatch outputs_match;  // where its last tokens match the output index
    Drafted last;               // its last draft, until its next tokens judge it
    Verdicts verdicts;          // the engine's verdicts on its drafts
    Trial trial;                // what its last draft can be judged on (online learning)
    SetId set = 0;              // the datastores it drafts from
    uint32_t generation = 0;
    bool active = false;
  };
  void reset(Request& r, const uint32_t* tokens, std::size_t n);  // its tokens, from scratch
  // The draft phase of a step whose pairs have followed (step, engine_step).
  void draft_step(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, bool chain,
                  double min_score, const StepCurve* curve, uint64_t key_limit, const float* states,
                  const uint8_t* has_state, Retrieval* retrieval, StepOutput& out);
  void check_draft(std::size_t pairs, const std::vector<int64_t>& budgets, bool chain, const StepCurve* curve,
                   const float* states, const uint8_t* has_state) const;
  void check_rows(const EngineRows& e, std::size_t pairs) const;
  Request* find(Handle h);
  const Request* find(Handle h) const;
  void append(Request& r, const uint32_t* tokens, std::size_t n);  // committed tokens: they judge its last draft
  bool backs_off(int budget, bool chain) const { return !chain && budget >= options_.back_off_min_budget; }
  // `budget` cut to what fits in the context beside request r's tokens and the bonus token (Options::max_tokens).
  int fitting(const Request& r, int64_t budget) const;
  // The sources of one step but the datastore's: the live layer's tree (crest::live_layer), the request's own match
  // and the output index's.
  void gather(Request& r, const Retrieved& in, int nodes);
  // The step's checks and its follow (Core::step): false when a pair did not follow or held a bad id.
  void check(const StepInput& in) const;
  bool follow(const StepInput& in, StepOutput& out);
  bool score_candidate(SetId set, const SourceTree* candidate, int max_depth, const float* state);
  OnlineFit& fit_of(SetId set, bool with_model);
  // The trial of the candidate just cut (z_.merged, z_.x, z_.model, z_.picked) into `t`.
  void capture(SetId set, bool with_model, Trial& t);
  // Judge request r's trial against its `n` new tokens; each outcome to its set's fit.
  void learn(Request& r, const uint32_t* tokens, std::size_t n);
  bool online() const { return options_.online_strength > 0.0; }
  // The next-state estimates of a step's pairs that have a state (the head's, in one pass over its weights; the states
  // themselves without a head): the estimate of pair i, or nullptr.
  void estimate(const std::vector<Handle>& handles, const float* states, const uint8_t* has_state);
  const float* estimate_of(std::size_t i, const float* states) const;
  void cut(bool chain, int budget, double min_score, Drafted& out);
  void draft_one(Request& r, const Retrieved& in, int budget, bool chain, double min_score, const float* state,
                 Drafted& out);

  struct Scratch {  // one step's working arrays, kept between steps (their memory is reused)
    Tree local, earlier, live_sum;
    SourceTree local_view, earlier_view, live_view;
    std::vector<int32_t> live_where;  // live_layer's scratch
    std::vector<const SourceTree*> sources;
    ChildMap children;
    Union merged;
    std::vector<double> x, score, model;  // model: the model features (with a state)
    std::vector<float> head_in, estimates, head;  // the head's inputs and estimates [rows with a state, d]; its scratch
    std::vector<uint32_t> bonus;          // their bonus tokens
    std::vector<int64_t> at;              // each pair's row in estimates (-1: none)
    std::vector<uint8_t> has_kids;
    CutScratch cut;
    std::vector<int32_t> picked, picked_parents;
    Drafted candidate;
    Retrieved retrieved;
    StoredScratch stored;
    std::vector<uint8_t> row_taken, request_taken;  // follow_rows: rows and requests (by slot) followed in the call
    std::vector<uint32_t> next;                     // follow_rows: a row's new int64 ids as tokens
    std::vector<int64_t> index;                     // step: each pair's row
    std::vector<double> discounted;                 // cut_to_curve: the batch's discounted scores
    std::vector<uint8_t> keep;
    std::vector<int32_t> order;
    Trial trial;                                     // draft_one: the best candidate's trial so far
    std::vector<uint8_t> drafted;                    // capture: the drafted nodes of the table
    std::vector<int32_t> slot;                       // capture: each node's index in the trial (-1: none)
  };

  Scratch z_;
  Calibration calibration_, with_model_;
  ModelView model_;
  std::shared_ptr<const Head> head_;
  Options options_;
  OutputIndex outputs_;
  Verdicts verdicts_;  // every request's, decayed: where a new request's ratio starts
  std::vector<Request> slots_;
  std::vector<uint32_t> free_;
  std::vector<OnlineFit> fits_[2];  // per datastore set, the online fits: without, with the model features
};

}  // namespace crest
