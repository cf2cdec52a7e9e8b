#include "core.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace crest {

// -- retrieval strategies ------------------------------------------------------------------------------------------

StoredTrees::StoredTrees(const StoreSet* sets, std::size_t num_sets, StoredScratch* scratch)
    : sets_(sets), num_sets_(num_sets), scratch_(scratch) {}

bool StoredTrees::retrieve(std::size_t, SetId set, const uint32_t* tokens, std::size_t n, bool back_off,
                           Retrieved& out) {
  out.candidates.clear();
  out.live = out.delta = SourceTree{};
  if (set < 0 || static_cast<std::size_t>(set) >= num_sets_) return true;  // a set without stores: none
  const Replica* const* stores = sets_[set].stores;
  for (int k = 0; k < kStoreKinds; ++k) {  // the datastores' candidates (every stored suffix when backing off), live
    if (!stores[k]) continue;
    std::size_t found = 0;
    std::vector<Tree>& trees = scratch_->trees[k];
    if (!stored_suffixes(*stores[k], tokens, n, k < 2 && back_off, trees, lengths_, found, scratch_->record)) {
      damaged = set * kStoreKinds + k;
      return false;
    }
    for (std::size_t j = 0; j < found; ++j) {
      SourceTree tree = SourceTree::of(trees[j], lengths_[j]);
      if (k < 2)
        out.candidates.push_back(tree);
      else
        (k == 2 ? out.live : out.delta) = tree;
    }
  }
  return true;
}

void StoredTrees::prefetch(std::size_t, SetId set, const uint32_t* tokens, std::size_t n) {
  if (set < 0 || static_cast<std::size_t>(set) >= num_sets_) return;
  for (const Replica* store : sets_[set].stores)
    if (store) store->prefetch(tokens, n);
}

// -- the request table ---------------------------------------------------------------------------------------------

namespace {

void check_token_bias(const Calibration& cal) {
  const auto& ids = cal.bias_tokens;
  if (ids.size() != cal.token_bias.size())
    throw std::invalid_argument("the calibration's token bias has " + std::to_string(ids.size()) + " tokens and " +
                                std::to_string(cal.token_bias.size()) + " biases");
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || (i && ids[i] <= ids[i - 1]) || !std::isfinite(cal.token_bias[i]))
      throw std::invalid_argument("the calibration's token bias needs ascending, unique, non-negative token ids and "
                                  "finite biases");
}

}  // namespace

Core::Core(Calibration calibration, Options options)
    : calibration_(std::move(calibration)), options_(options), outputs_(options.outputs_bytes, options.outputs_depth) {
  if (static_cast<int>(calibration_.coef.size()) != kNumFeatures)
    throw std::invalid_argument("the calibration has " + std::to_string(calibration_.coef.size()) +
                                " weights, the native core's features are " + std::to_string(kNumFeatures));
  const Options& o = options_;
  if (o.local_depth < 1 || o.outputs_depth < 1 || o.match_nodes < 1 || o.context_tokens < 1 ||
      o.back_off_min_budget < 0 || o.max_tokens < 0 || calibration_.prior < 0)
    throw std::invalid_argument(
        "local_depth, outputs_depth, match_nodes and context_tokens must be >= 1, back_off_min_budget and max_tokens "
        ">= 0 and the calibration's prior >= 0");
  if (!(o.online_strength >= 0.0 && std::isfinite(o.online_strength)) || !(o.online_memory >= 1.0) ||
      !std::isfinite(o.online_memory) || o.online_refit < 1 || o.online_share < 0)
    throw std::invalid_argument("online_strength must be finite and >= 0, online_memory finite and >= 1, "
                                "online_refit >= 1 and online_share >= 0");
  check_token_bias(calibration_);
  z_.sources.assign(kNumSources, nullptr);
}

Core::Request* Core::find(Handle h) {
  uint64_t slot = static_cast<uint64_t>(h) & 0xFFFFFFFFULL;
  if (h < 0 || slot >= slots_.size()) return nullptr;
  Request& r = slots_[slot];
  return r.active && r.generation == static_cast<uint64_t>(h) >> 32 ? &r : nullptr;
}

const Core::Request* Core::find(Handle h) const { return const_cast<Core*>(this)->find(h); }

int Core::fitting(const Request& r, int64_t budget) const {
  if (options_.max_tokens <= 0) return static_cast<int>(budget);
  const int64_t room = int64_t{options_.max_tokens} - 1 - static_cast<int64_t>(r.tokens.size());
  return static_cast<int>(std::clamp<int64_t>(room, 0, std::max<int64_t>(budget, 0)));
}

Handle Core::start(const uint32_t* prompt, std::size_t n, SetId set) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Request& r = slots_[slot];
  r.generation = (r.generation + 1) & 0x7FFFFFFF;
  r.active = true;
  r.set = set;
  reset(r, prompt, n);
  r.verdicts = Verdicts{};
  return static_cast<Handle>(static_cast<uint64_t>(r.generation) << 32 | slot);
}

void Core::reset(Request& r, const uint32_t* tokens, std::size_t n) {
  r.tokens.assign(tokens, tokens + n);
  r.prompt_len = n;
  r.automaton = Automaton();
  r.automaton.extend(tokens, n);
  r.outputs_match = OutputMatch{};
  r.last.clear();
  r.trial.clear();
}

// -- the calibration fitted online (online.hpp) --------------------------------------------------------------------

OnlineFit& Core::fit_of(SetId set, bool with_model) {
  std::vector<OnlineFit>& fits = fits_[with_model];
  const OnlineOptions o{options_.online_strength, options_.online_memory, options_.online_refit, options_.online_share};
  while (static_cast<SetId>(fits.size()) <= set) fits.emplace_back(with_model ? with_model_ : calibration_, o);
  return fits[static_cast<std::size_t>(set)];
}

const Calibration& Core::calibration_of(SetId set, bool with_model) {
  if (!online()) return with_model ? with_model_ : calibration_;
  return fit_of(set, with_model).calibration();
}

int64_t Core::outcomes_of(SetId set, bool with_model) { return online() ? fit_of(set, with_model).outcomes() : 0; }

int64_t Core::unshared_of(SetId set, bool with_model) {
  return online() ? fit_of(set, with_model).unshared() : 0;
}

std::string Core::fold(SetId set, bool with_model, const std::string* fleet) {
  if (!online()) throw std::invalid_argument("online learning is off (online_strength 0): nothing to fold");
  return fit_of(set, with_model).fold(fleet);
}

void Core::forget(SetId set) {
  const OnlineOptions o{options_.online_strength, options_.online_memory, options_.online_refit, options_.online_share};
  for (int k = 0; k < 2; ++k)
    if (set >= 0 && static_cast<std::size_t>(set) < fits_[k].size())
      fits_[k][static_cast<std::size_t>(set)] = OnlineFit(k ? with_model_ : calibration_, o);
}

void Core::capture(SetId set, bool with_model, Trial& t) {
  const Union& u = z_.merged;
  t.clear();
  t.with_model = with_model;
  t.width = kNumFeatures + (with_model ? kNumModelFeatures : 0);
  z_.drafted.assign(u.size(), 0);
  for (int32_t m : z_.picked) z_.drafted[static_cast<std::size_t>(m)] = 1;
  z_.slot.assign(u.size(), -1);
  bool present[kNumSources];
  for (int k = 0; k < kNumSources; ++k) present[k] = z_.sources[k] && z_.sources[k]->size;
  const Calibration& cal = calibration_of(set, with_model);
  for (std::size_t m = 0; m < u.size(); ++m) {  // parents first: a drafted node's slot is known before its children
    const int32_t p = u.parents[m];
    if (p >= 0 && !(z_.drafted[static_cast<std::size_t>(p)] && z_.slot[static_cast<std::size_t>(p)] >= 0)) continue;
    z_.slot[m] = static_cast<int32_t>(t.tokens.size());
    t.tokens.push_back(u.tokens[m]);
    t.parents.push_back(p < 0 ? -1 : z_.slot[static_cast<std::size_t>(p)]);
    const double* row = &z_.x[m * kNumFeatures];
    for (int k = 0; k < kNumSources; ++k)  // an absent source's block is 0 (the table holds stale values there)
      for (int c = 0; c < kBlock; ++c) t.x.push_back(present[k] ? row[k * kBlock + c] : 0.0);
    t.x.push_back(row[kAgree]);
    t.x.push_back(row[kLogDepth]);
    if (with_model) t.x.insert(t.x.end(), &z_.model[m * kNumModelFeatures], &z_.model[(m + 1) * kNumModelFeatures]);
    double offset = 0.0;
    auto at = std::lower_bound(cal.bias_tokens.begin(), cal.bias_tokens.end(), u.tokens[m]);
    if (at != cal.bias_tokens.end() && *at == u.tokens[m]) offset = cal.token_bias[at - cal.bias_tokens.begin()];
    t.offsets.push_back(offset);
  }
}

void Core::learn(Request& r, const uint32_t* tokens, std::size_t n) {
  Trial& t = r.trial;
  if (t.tokens.empty()) return;
  OnlineFit& fit = fit_of(r.set, t.with_model);
  int32_t at = -1;  // the node reached (-1: the root)
  for (std::size_t d = 0; d < n; ++d) {
    int32_t hit = -1;
    bool any = false;
    for (std::size_t k = static_cast<std::size_t>(at + 1); k < t.tokens.size(); ++k) {  // children after parents
      if (t.parents[k] != at) continue;
      any = true;
      const bool yes = t.tokens[k] == static_cast<int64_t>(tokens[d]);
      fit.add(&t.x[k * t.width], t.offsets[k], yes);
      if (yes) hit = static_cast<int32_t>(k);
    }
    if (!any || hit < 0) break;
    at = hit;
  }
  t.clear();
}

SetId Core::set_of(Handle h) const {
  const Request* r = find(h);
  return r ? r->set : -1;
}

void Core::append(Request& r, const uint32_t* tokens, std::size_t n) {
  if (n == 0) return;
  const Drafted& d = r.last;
  judge(d.tokens.data(), d.parents.data(), d.scores.data(), d.tokens.size(), tokens, n, r.verdicts, verdicts_);
  learn(r, tokens, n);
  r.last.clear();
  r.tokens.insert(r.tokens.end(), tokens, tokens + n);
  r.automaton.extend(tokens, n);
}

namespace {

// Whether `have` tokens are the first of a row's ids (ids of another type compared by value: an int64 id that does not
// fit 32 bits matches no token).
template <class T>
bool starts_with(const T* row, const std::vector<uint32_t>& have) {
  if constexpr (sizeof(T) == sizeof(uint32_t)) {  // one compare: a token and a non-negative int32 share their bits
    return have.empty() || std::memcmp(row, have.data(), have.size() * sizeof(uint32_t)) == 0;
  } else {
    for (std::size_t k = 0; k < have.size(); ++k)
      if (row[k] != static_cast<T>(have[k])) return false;
    return true;
  }
}

}  // namespace

template <class T>
int64_t Core::follow_rows(const Handle* handles, const T* rows, std::size_t num_rows, std::size_t width,
                          const int64_t* index, const T* lengths, std::size_t pairs, int64_t limit, uint8_t* followed,
                          int64_t* bad_id) {
  std::vector<uint8_t>& row_taken = z_.row_taken;
  std::vector<uint8_t>& request_taken = z_.request_taken;  // by slot
  row_taken.assign(num_rows, 0);
  request_taken.assign(slots_.size(), 0);
  for (std::size_t i = 0; i < pairs; ++i) {  // which pairs follow, and their new ids checked: nothing changed yet
    followed[i] = 0;
    const auto row = static_cast<std::size_t>(index[i]);
    const uint64_t slot = static_cast<uint64_t>(handles[i]) & 0xFFFFFFFFULL;
    const Request* r = find(handles[i]);
    if (!r) {  // stopped meanwhile: nothing to follow, and an empty draft
      followed[i] = 1;
      continue;
    }
    if (row_taken[row] || request_taken[slot]) continue;
    const T* at = rows + row * width;
    const auto n = static_cast<std::size_t>(lengths[row]);
    if (r->tokens.size() > n || !starts_with(at, r->tokens)) continue;
    for (std::size_t k = r->tokens.size(); k < n; ++k)
      if (at[k] < 0 || static_cast<int64_t>(at[k]) >= limit) {
        *bad_id = static_cast<int64_t>(at[k]);
        std::fill(followed, followed + i, 0);
        return static_cast<int64_t>(i);
      }
    followed[i] = row_taken[row] = request_taken[slot] = 1;
  }
  for (std::size_t i = 0; i < pairs; ++i) {  // then each followed request takes its row's new ids
    Request* found = followed[i] ? find(handles[i]) : nullptr;
    if (!found) continue;
    Request& r = *found;
    const T* at = rows + static_cast<std::size_t>(index[i]) * width;
    const auto n = static_cast<std::size_t>(lengths[index[i]]);
    const std::size_t have = r.tokens.size();
    if constexpr (sizeof(T) == sizeof(uint32_t)) {  // in [0, limit): checked above
      append(r, reinterpret_cast<const uint32_t*>(at + have), n - have);
    } else {
      std::vector<uint32_t>& next = z_.next;
      next.assign(at + have, at + n);
      append(r, next.data(), next.size());
    }
  }
  return -1;
}

template int64_t Core::follow_rows<int32_t>(const Handle*, const int32_t*, std::size_t, std::size_t, const int64_t*,
                                            const int32_t*, std::size_t, int64_t, uint8_t*, int64_t*);
template int64_t Core::follow_rows<int64_t>(const Handle*, const int64_t*, std::size_t, std::size_t, const int64_t*,
                                            const int64_t*, std::size_t, int64_t, uint8_t*, int64_t*);

bool Core::stop(Handle h, std::vector<uint32_t>& output) {
  Request* r = find(h);
  if (!r) return false;
  output.assign(r->tokens.begin() + static_cast<std::ptrdiff_t>(r->prompt_len), r->tokens.end());
  r->active = false;
  r->last.clear();
  r->trial.clear();
  std::vector<uint32_t>().swap(r->tokens);
  r->automaton = Automaton();
  free_.push_back(static_cast<uint32_t>(static_cast<uint64_t>(h) & 0xFFFFFFFFULL));
  outputs_.add(output);
  return true;
}

void Core::add_outputs(const uint32_t* tokens, std::size_t num_tokens, const int64_t* lengths, std::size_t n) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (lengths[i] < 0) throw std::invalid_argument("add_outputs: a length is negative");
    total += static_cast<std::size_t>(lengths[i]);
  }
  if (total != num_tokens) throw std::invalid_argument("add_outputs: the lengths do not add up to the tokens given");
  std::vector<uint32_t> output;
  for (std::size_t i = 0, at = 0; i < n; at += static_cast<std::size_t>(lengths[i]), ++i) {
    output.assign(tokens + at, tokens + at + lengths[i]);
    outputs_.add(output);
  }
}

std::size_t Core::count(Handle h) const {
  const Request* r = find(h);
  return r ? r->tokens.size() : 0;
}

void Core::tokens(Handle h, std::size_t from, std::vector<uint32_t>& out) const {
  const Request* r = find(h);
  out.clear();
  if (r && from < r->tokens.size()) out.assign(r->tokens.begin() + static_cast<std::ptrdiff_t>(from), r->tokens.end());
}

// -- the step --------------------------------------------------------------------------------------------------------

namespace {

std::string outside(const char* what, std::size_t i, int64_t value, const std::string& range, const char* fix) {
  return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(value) + " is outside " + range + "; " +
         fix;
}

}  // namespace

void Core::set_model(Calibration with_model, ModelView view, std::shared_ptr<const Head> head) {
  if (static_cast<int>(with_model.coef.size()) != kNumFeatures + kNumModelFeatures)
    throw std::invalid_argument("the with-model calibration has " + std::to_string(with_model.coef.size()) +
                                " weights; the features and the model features are " +
                                std::to_string(kNumFeatures + kNumModelFeatures));
  if (with_model.prior != calibration_.prior)
    throw std::invalid_argument("the with-model calibration's prior differs from the core's: fit both on one prior");
  if (!view.lm_head || view.vocab < 1 || view.d < 1) throw std::invalid_argument("the LM head is empty");
  check_token_bias(with_model);
  if (head) {
    head->check();
    if (head->d != view.d)
      throw std::invalid_argument("the head's width is " + std::to_string(head->d) + ", the LM head's " +
                                  std::to_string(view.d) + ": train a head for this model");
  }
  with_model_ = std::move(with_model);
  model_ = view;
  head_ = std::move(head);
  fits_[1].clear();  // the with-model fits start again from the new prior
}

void Core::estimate(const std::vector<Handle>& handles, const float* states, const uint8_t* has_state) {
  z_.at.assign(handles.size(), -1);
  if (!states || !head_) return;
  const std::size_t d = model_.d;
  z_.bonus.clear();
  z_.head_in.clear();
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const Request* r = find(handles[i]);
    // a row whose last token has no embedding row (an engine vocabulary wider than the head's) is scored without
    // an estimate, as a row without a state
    if (!has_state[i] || !r || r->tokens.empty() || r->tokens.back() >= head_->vocab) continue;
    z_.at[i] = static_cast<int64_t>(z_.bonus.size());
    z_.bonus.push_back(r->tokens.back());
    z_.head_in.insert(z_.head_in.end(), states + i * d, states + (i + 1) * d);
  }
  z_.estimates.resize(z_.head_in.size());
  if (!z_.bonus.empty()) head_->forward(z_.head_in.data(), z_.bonus.data(), z_.bonus.size(), z_.estimates.data(), z_.head);
}

const float* Core::estimate_of(std::size_t i, const float* states) const {
  if (!states) return nullptr;
  if (!head_) return states + i * model_.d;
  return z_.at[i] >= 0 ? z_.estimates.data() + static_cast<std::size_t>(z_.at[i]) * model_.d : nullptr;
}

void Core::check_draft(std::size_t pairs, const std::vector<int64_t>& budgets, bool chain, const StepCurve* curve,
                       const float* states, const uint8_t* has_state) const {
  if (states && !model_.lm_head)
    throw std::invalid_argument("states were given to a core without a model: call set_model first");
  if (budgets.size() != pairs)
    throw std::invalid_argument(std::to_string(budgets.size()) + " budgets for " + std::to_string(pairs) +
                                " requests; pass one budget per request");
  for (std::size_t i = 0; i < pairs; ++i)
    if (budgets[i] < 0 || budgets[i] > kMaxBudget)
      throw std::invalid_argument(outside("budgets", i, budgets[i], "0.." + std::to_string(kMaxBudget),
                                          "pass the draft nodes to verify (0: none)"));
  if (curve && !chain) throw std::invalid_argument("a step-cost curve cuts chains only: pass chain=True");
  if (states) {
    const std::size_t d = model_.d;
    for (std::size_t i = 0; i < pairs; ++i) {
      if (!has_state[i]) continue;
      uint32_t all_ones = 0;  // a float whose exponent bits are all ones is NaN or inf
      for (const float* x = states + i * d; x != states + (i + 1) * d; ++x) {
        uint32_t bits;
        std::memcpy(&bits, x, sizeof bits);
        all_ones |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
      }
      if (all_ones)
        throw std::invalid_argument("states[" + std::to_string(i) + "] holds NaN or inf; pass the target's hidden "
                                    "state of the row, or mark the row in state_rows as having none");
    }
  }
}

void Core::check_rows(const EngineRows& e, std::size_t pairs) const {
  const std::size_t rows = e.num_rows;
  if (!e.index && pairs > rows)
    throw std::invalid_argument("the engine's rows hold " + std::to_string(rows) + " rows for " +
                                std::to_string(pairs) + " requests; pass one request per row, or the rows' index");
  for (std::size_t i = 0; i < pairs; ++i) {
    const int64_t at = e.index ? e.index[i] : static_cast<int64_t>(i);
    if (at < 0 || static_cast<std::size_t>(at) >= rows)
      throw std::invalid_argument(outside("index", i, at, "the " + std::to_string(rows) + " rows given",
                                          "pass row numbers of the engine's batch"));
    const int64_t n = e.wide ? static_cast<const int64_t*>(e.lengths)[at] : static_cast<const int32_t*>(e.lengths)[at];
    if (n < 0 || static_cast<std::size_t>(n) > e.width)
      throw std::invalid_argument(outside("lengths", static_cast<std::size_t>(at), n,
                                          "0.." + std::to_string(e.width) + " (the rows' columns)",
                                          "pass each row's count of tokens"));
  }
}

void Core::check(const StepInput& in) const {
  check_draft(in.handles.size(), in.budgets, in.chain, in.curve, in.states, in.has_state);
  if (in.rows) check_rows(*in.rows, in.handles.size());
}

bool Core::follow(const StepInput& in, StepOutput& out) {
  const std::size_t pairs = in.handles.size();
  out.followed.assign(pairs, 1);
  if (const EngineRows* e = in.rows) {
    std::vector<int64_t>& at = z_.index;
    if (e->index) {
      at.assign(e->index, e->index + pairs);
    } else {
      at.resize(pairs);
      for (std::size_t i = 0; i < pairs; ++i) at[i] = static_cast<int64_t>(i);
    }
    out.bad = e->wide ? follow_rows<int64_t>(in.handles.data(), static_cast<const int64_t*>(e->rows), e->num_rows,
                                             e->width, at.data(), static_cast<const int64_t*>(e->lengths), pairs,
                                             e->limit, out.followed.data(), &out.bad_id)
                      : follow_rows<int32_t>(in.handles.data(), static_cast<const int32_t*>(e->rows), e->num_rows,
                                             e->width, at.data(), static_cast<const int32_t*>(e->lengths), pairs,
                                             e->limit, out.followed.data(), &out.bad_id);
  } else if (in.counts) {
    const uint32_t* at = in.appended;
    for (std::size_t i = 0; i < pairs; ++i) {
      if (Request* r = find(in.handles[i])) append(*r, at, static_cast<std::size_t>(in.counts[i]));
      at += in.counts[i];  // a request stopped meanwhile follows nothing (followed: it drafts nothing)
    }
  }
  return out.bad < 0 && std::all_of(out.followed.begin(), out.followed.end(), [](uint8_t f) { return f != 0; });
}

void Core::step(const StepInput& in, Retrieval* retrieval, StepOutput& out) {
  check(in);
  out = StepOutput{};
  if (!follow(in, out)) return;
  draft_step(in.handles, in.budgets, in.chain, in.min_score, in.curve, in.key_limit, in.states, in.has_state,
             retrieval, out);
}

void Core::draft_step(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, bool chain,
                      double min_score, const StepCurve* curve, uint64_t key_limit, const float* states,
                      const uint8_t* has_state, Retrieval* retrieval, StepOutput& out) {
  auto* given = dynamic_cast<GivenTrees*>(retrieval);
  if (given) given->stale = false;
  if (retrieval) {
    for (Handle h : handles) out.inactive += !active(h);
    out.drafted = draft(handles, budgets, *retrieval, chain, min_score, out.drafts, states, has_state);
  }
  if (!out.drafted) {
    out.drafts.clear();
    out.inactive = 0;
    out.damaged = retrieval ? retrieval->damaged : -1;
    if (!retrieval || (given && given->stale)) {  // what a round trip must fetch, for each row's context now
      plan(handles, budgets, chain, kTailTokens, key_limit, out.back_off, out.tails, out.counts, out.sets);
      out.planned = true;
    }
    return;
  }
  if (curve) cut_to_curve(handles, *curve, out.drafts);
}

namespace {

// Whether row `at` of `e` holds ids in [0, limit) from column `from` on; the first that is not, in *bad.
template <class T>
bool ids_in_range(const T* at, std::size_t from, std::size_t n, int64_t limit, int64_t* bad) {
  for (std::size_t k = from; k < n; ++k)
    if (at[k] < 0 || static_cast<int64_t>(at[k]) >= limit) {
      *bad = static_cast<int64_t>(at[k]);
      return false;
    }
  return true;
}

}  // namespace

void Core::engine_step(const EngineInput& in, Retrieval* retrieval, StepOutput& out) {
  const std::size_t pairs = in.handles.size();
  check_draft(pairs, in.budgets, in.chain, in.curve, in.states, in.has_state);
  check_rows(in.rows, pairs);
  for (std::size_t i = 0; i < pairs; ++i)
    if (in.handles[i] == kStart && (!in.sets || in.sets[i] < 0))
      throw std::invalid_argument("sets[" + std::to_string(i) + "] is not a datastore set; pass the set each new "
                                  "request drafts from (>= 0)");
  out = StepOutput{};
  out.outputs.resize(in.stops.size());
  for (std::size_t j = 0; j < in.stops.size(); ++j) stop(in.stops[j], out.outputs[j]);
  const EngineRows& e = in.rows;
  out.followed.assign(pairs, 1);
  out.handles = in.handles;
  std::vector<uint32_t>& next = z_.next;
  for (std::size_t i = 0; i < pairs; ++i) {
    const auto row = static_cast<std::size_t>(e.index ? e.index[i] : static_cast<int64_t>(i));
    const auto n = static_cast<std::size_t>(e.wide ? static_cast<const int64_t*>(e.lengths)[row]
                                                   : static_cast<const int32_t*>(e.lengths)[row]);
    Request* r = in.handles[i] == kStart ? nullptr : find(in.handles[i]);
    if (!r && in.handles[i] != kStart) continue;  // stopped meanwhile: nothing to follow, an empty draft
    std::size_t have = r ? r->tokens.size() : 0;
    bool extends = r && have <= n;
    if (extends && have > 0) {  // the row goes on from what the request holds (its last token checked: rows move)
      const uint32_t last = r->tokens[have - 1];
      extends = e.wide ? static_cast<const int64_t*>(e.rows)[row * e.width + have - 1] == static_cast<int64_t>(last)
                       : static_cast<const int32_t*>(e.rows)[row * e.width + have - 1] == static_cast<int32_t>(last);
    }
    const std::size_t from = extends ? have : 0;
    int64_t bad = 0;
    const bool ok = e.wide ? ids_in_range(static_cast<const int64_t*>(e.rows) + row * e.width, from, n, e.limit, &bad)
                           : ids_in_range(static_cast<const int32_t*>(e.rows) + row * e.width, from, n, e.limit, &bad);
    if (!ok) {  // an id the model cannot mean: this pair follows nothing and drafts nothing, the others go on
      out.followed[i] = 0;
      if (out.bad < 0) out.bad = static_cast<int64_t>(i), out.bad_id = bad;
      continue;
    }
    if (e.wide) {
      const int64_t* at = static_cast<const int64_t*>(e.rows) + row * e.width;
      next.assign(at + from, at + n);
    } else {
      const auto* at = reinterpret_cast<const uint32_t*>(static_cast<const int32_t*>(e.rows) + row * e.width);
      next.assign(at + from, at + n);  // in [0, limit): checked above
    }
    if (!r) {
      out.handles[i] = start(next.data(), next.size(), in.sets[i]);
    } else if (!extends) {
      reset(*r, next.data(), next.size());
      ++out.resynced;
    } else {
      append(*r, next.data(), next.size());
    }
  }
  std::vector<int64_t> budgets = in.budgets;
  for (std::size_t i = 0; i < pairs; ++i)
    if (!out.followed[i]) budgets[i] = 0;
  const int64_t bad = out.bad, bad_id = out.bad_id;
  draft_step(out.handles, budgets, in.chain, in.min_score, in.curve, in.key_limit, in.states, in.has_state, retrieval,
             out);
  out.bad = bad, out.bad_id = bad_id;
}

void Core::gather(Request& r, const Retrieved& in, int nodes) {
  const bool* on = options_.sources;
  auto& src = z_.sources;
  std::fill(src.begin(), src.end(), nullptr);
  z_.live_view = on[kLive] ? live_layer(in.live, in.delta, z_.children, z_.live_sum, z_.live_where) : SourceTree{};
  if (z_.live_view.size) src[kLive] = &z_.live_view;
  auto [state, len] = r.automaton.repeated_suffix();
  z_.local.clear();
  if (on[kLocal] && len > 0) r.automaton.continuations(state, nodes, options_.local_depth, 1, z_.local);
  z_.local_view = SourceTree::of(z_.local, len);
  if (z_.local_view.size) src[kLocal] = &z_.local_view;
  int earlier_len = 0;
  if (on[kOutputs] && outputs_.follow(r.outputs_match, r.tokens.data(), r.tokens.size(),
                                      static_cast<std::size_t>(options_.context_tokens), nodes, z_.earlier, earlier_len))
    src[kOutputs] = &z_.earlier_view;
  z_.earlier_view = SourceTree::of(z_.earlier, earlier_len);
}

bool Core::score_candidate(SetId set, const SourceTree* candidate, int max_depth, const float* state) {
  z_.sources[kDatastore] = candidate && candidate->size ? candidate : nullptr;
  if (!merge(z_.sources, z_.children, z_.merged, max_depth)) return false;
  features(z_.sources, z_.merged, calibration_.prior, z_.x, z_.has_kids);
  if (!state) {
    scores(calibration_of(set, false), z_.sources, z_.merged, z_.x, z_.score);
    return true;
  }
  model_features(model_, state, z_.merged, z_.model);
  scores(calibration_of(set, true), z_.sources, z_.merged, z_.x, z_.score, z_.model.data());
  return true;
}

void Core::cut(bool chain, int budget, double min_score, Drafted& out) {
  const Union& u = z_.merged;
  Scored t{u.parents.data(), u.depths.data(), z_.score.data(), u.size()};
  out.clear();
  if (chain) {
    chain_cut(t, budget, min_score, z_.cut, z_.picked);
    for (std::size_t j = 0; j < z_.picked.size(); ++j) out.parents.push_back(static_cast<int32_t>(j) - 1);
  } else {
    tree_cut(t, budget, min_score, z_.cut, z_.picked, out.parents);
  }
  for (int32_t m : z_.picked) {
    out.tokens.push_back(u.tokens[m]);
    out.scores.push_back(z_.score[m]);
    out.sources.push_back(holders(z_.sources, z_.x, static_cast<std::size_t>(m)));
  }
}

void Core::draft_one(Request& r, const Retrieved& in, int budget, bool chain, double min_score, const float* state,
                     Drafted& out) {
  gather(r, in, std::max(budget, options_.match_nodes));
  out.clear();
  double best_gain = -1.0;
  const std::size_t given = options_.sources[kDatastore] ? in.candidates.size() : 0;
  const bool learning = online();
  r.trial.clear();
  for (std::size_t c = 0; c < std::max<std::size_t>(given, 1); ++c) {  // no candidate: the other sources
    const SourceTree* candidate = c < given ? &in.candidates[c] : nullptr;
    if (!score_candidate(r.set, candidate, budget, state)) continue;  // no node deeper than the budget can be drafted
    cut(chain, budget, min_score, z_.candidate);
    double gain = 0.0;  // the draft's expected accepted length
    for (double v : z_.candidate.scores) gain += v;
    if (gain > best_gain) {
      best_gain = gain;
      std::swap(out, z_.candidate);
      out.chosen = candidate ? static_cast<int64_t>(c) : -1;
      if (learning) {  // what the engine's verdict on this draft will teach its set's fit
        capture(r.set, state != nullptr, z_.trial);
        std::swap(r.trial, z_.trial);
      }
    }
  }
}

bool Core::draft(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, Retrieval& retrieval,
                 bool chain, double min_score, std::vector<Drafted>& out, const float* states,
                 const uint8_t* has_state) {
  out.resize(handles.size());
  estimate(handles, states, has_state);
  for (std::size_t i = 0; i < handles.size(); ++i) {  // every row's first probes in flight before any is read
    const Request* r = find(handles[i]);
    if (r && fitting(*r, budgets[i]) > 0) retrieval.prefetch(i, r->set, r->tokens.data(), r->tokens.size());
  }
  for (std::size_t i = 0; i < handles.size(); ++i) {
    Request* r = find(handles[i]);
    out[i].clear();
    if (!r) continue;  // stopped while its lookups ran: an empty draft
    if (const int budget = fitting(*r, budgets[i]); budget > 0) {
      if (!retrieval.retrieve(i, r->set, r->tokens.data(), r->tokens.size(), backs_off(budget, chain), z_.retrieved))
        return false;
      const float* state = states && has_state[i] ? estimate_of(i, states) : nullptr;
      draft_one(*r, z_.retrieved, budget, chain, min_score, state, out[i]);
    } else {
      r->trial.clear();  // nothing drafted: nothing to judge
    }
  }
  for (std::size_t i = 0; i < handles.size(); ++i)  // each draft handed out is judged by the request's next tokens,
    if (Request* r = find(handles[i])) r->last = out[i];  // before any cut to a step-cost curve (feedback.hpp)
  return true;
}

void Core::cut_to_curve(const std::vector<Handle>& handles, const StepCurve& curve, std::vector<Drafted>& out) {
  if (out.empty()) return;
  std::vector<double>& s = z_.discounted;
  s.clear();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const Request* r = find(handles[i]);
    const std::size_t at = s.size(), n = out[i].scores.size();
    s.resize(at + n);
    discount_chain(out[i].scores.data(), n, r ? acceptance_ratio(r->verdicts, verdicts_) : 1.0, s.data() + at);
  }
  goodput_keep(s.data(), s.size(), static_cast<int64_t>(out.size()), curve, z_.keep, z_.order);
  std::size_t at = 0;
  for (auto& d : out) {
    const std::size_t n = d.scores.size();
    const auto k = static_cast<std::size_t>(std::count(z_.keep.begin() + static_cast<std::ptrdiff_t>(at),
                                                       z_.keep.begin() + static_cast<std::ptrdiff_t>(at + n), 1));
    d.tokens.resize(k);
    d.parents.resize(k);
    d.scores.resize(k);
    d.sources.resize(k);
    at += n;
  }
}

double Core::acceptance(Handle h) const {
  const Request* r = find(h);
  return r ? acceptance_ratio(r->verdicts, verdicts_) : -1.0;
}

void Core::plan(const std::vector<Handle>& handles, const std::vector<int64_t>& budgets, bool chain, std::size_t tail,
                uint64_t limit, std::vector<uint8_t>& back_off, std::vector<std::vector<uint32_t>>& tails,
                std::vector<uint64_t>& counts, std::vector<SetId>& sets) const {
  back_off.assign(handles.size(), 0);
  tails.assign(handles.size(), {});
  counts.assign(handles.size(), 0);
  sets.assign(handles.size(), -1);
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const Request* r = find(handles[i]);
    if (r) counts[i] = r->tokens.size(), sets[i] = r->set;
    const int budget = r ? fitting(*r, budgets[i]) : 0;
    if (budget <= 0) continue;
    back_off[i] = backs_off(budget, chain);
    std::size_t n = std::min(tail, r->tokens.size());
    auto begin = r->tokens.end() - static_cast<std::ptrdiff_t>(n);
    for (auto it = begin; it != r->tokens.end(); ++it)  // a key holding an id outside the keys' vocabulary is stored
      if (*it >= limit) begin = it + 1;                   // nowhere: only the tokens after the last such id are asked
    tails[i].assign(begin, r->tokens.end());
  }
}

void Core::tables(Handle h, const Retrieved& given, std::vector<NodeTable>& out, const float* state) {
  if (state && !model_.lm_head)
    throw std::invalid_argument("a state was given to a core without a model: call set_model first");
  Request* r = find(h);
  if (!r) throw std::out_of_range("request handle " + std::to_string(h) + " is not active");
  if (state && head_) {  // read as a step reads the row's state: through the head
    const uint8_t has = 1;
    estimate({h}, state, &has);
    state = estimate_of(0, state);
    if (!state)
      throw std::invalid_argument("the request's last token has no row in the head's embedding: pass the embedding of "
                                  "the vocabulary the request's tokens come from");
  }
  gather(*r, given, options_.match_nodes);
  out.clear();
  const std::size_t count = options_.sources[kDatastore] ? given.candidates.size() : 0;
  for (std::size_t c = 0; c < std::max<std::size_t>(count, 1); ++c) {
    const SourceTree* candidate = c < count ? &given.candidates[c] : nullptr;
    if (!score_candidate(r->set, candidate, std::numeric_limits<int>::max(), state)) continue;  // every node
    zero_absent(z_.sources, z_.x);
    out.push_back({z_.merged, z_.x, z_.score});
    if (!state) continue;
    std::vector<double>& x = out.back().features;  // each row's features, then its model features
    x.clear();
    for (std::size_t n = 0; n < z_.merged.size(); ++n) {
      x.insert(x.end(), z_.x.begin() + n * kNumFeatures, z_.x.begin() + (n + 1) * kNumFeatures);
      x.insert(x.end(), z_.model.begin() + n * kNumModelFeatures, z_.model.begin() + (n + 1) * kNumModelFeatures);
    }
  }
}

}  // namespace crest
