#include "core.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace crest {

namespace {

constexpr int kSources = 4;  // decoder.calibration.SOURCES: ds, live, local, outputs
constexpr int kBlock = 6;    // on, ratio, log_parent, ratio_x_log_parent, log_n, miss
constexpr int kFeatures = kSources * kBlock + 2;  // then agree, log_depth
constexpr int kAgree = kSources * kBlock;
constexpr int kLogDepth = kAgree + 1;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

SourceTree view(const Tree& t, int ngram_len) {
  SourceTree s;
  s.ngram_len = ngram_len;
  s.tokens = t.tokens.data();
  s.parents = t.parents.data();
  s.counts = t.counts.data();
  s.size = t.tokens.size();
  s.root_count = t.root_count;
  return s;
}

}  // namespace

// ---- the union's child map -----------------------------------------------------------------------------------

void ChildMap::reset(std::size_t capacity) {
  std::size_t want = 16;
  while (want < 2 * capacity) want <<= 1;
  if (keys_.size() < want) {
    keys_.assign(want, 0);
    values_.assign(want, -1);
  } else {
    std::fill(values_.begin(), values_.end(), -1);
  }
  mask_ = keys_.size() - 1;
}

int32_t* ChildMap::find_or_slot(int64_t parent, uint32_t token) {
  uint64_t key = (static_cast<uint64_t>(parent + 1) << 32) | token;
  for (std::size_t i = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 40) & mask_;; i = (i + 1) & mask_) {
    if (values_[i] < 0) {
      keys_[i] = key;
      return &values_[i];
    }
    if (keys_[i] == key) return &values_[i];
  }
}

// ---- the output index (decoder/output_index.py) -------------------------------------------------------------

void OutputIndex::add(const std::vector<uint32_t>& tokens) {
  if (tokens.empty() || max_bytes_ == 0) return;
  outputs_.push_back(tokens);
  automaton_.start_sequence();
  automaton_.extend(tokens.data(), tokens.size());
  if (automaton_.nbytes() > max_bytes_) evict();
}

void OutputIndex::evict() {
  using wide = unsigned __int128;
  const wide size = automaton_.nbytes(), tokens = automaton_.num_tokens(), target = max_bytes_ / 2;
  std::size_t keep = 0;
  wide held = 0;
  for (auto it = outputs_.rbegin(); it != outputs_.rend(); ++it) {  // newest first, sizes pro rata to tokens
    if ((held + it->size()) * size > target * tokens) break;
    held += it->size();
    ++keep;
  }
  evicted += static_cast<int64_t>(outputs_.size() - keep);
  evictions += 1;
  while (outputs_.size() > keep) outputs_.pop_front();
  automaton_ = Automaton();
  for (const auto& out : outputs_) {
    automaton_.start_sequence();
    automaton_.extend(out.data(), out.size());
  }
}

bool OutputIndex::match(const uint32_t* context, std::size_t n, int budget, Tree& out, int& length) const {
  auto [state, len] = automaton_.match(context, n);
  length = len;
  if (len == 0) return false;
  automaton_.continuations(state, budget, max_depth_, 0, out);
  return !out.tokens.empty();
}

// ---- the core ----------------------------------------------------------------------------------------------

Core::Core(const std::vector<double>& coef, double intercept, double prior, int local_depth, int match_nodes,
           std::size_t outputs_bytes, int outputs_depth, int context_tokens)
    : coef_(coef),
      intercept_(intercept),
      prior_(prior),
      local_depth_(local_depth),
      match_nodes_(match_nodes),
      context_tokens_(context_tokens),
      outputs_(outputs_bytes, outputs_depth) {
  if (static_cast<int>(coef_.size()) != kFeatures)
    throw std::invalid_argument("calibration has " + std::to_string(coef_.size()) + " weights, the native core " +
                                std::to_string(kFeatures));
  if (local_depth < 1 || outputs_depth < 1 || match_nodes < 1 || context_tokens < 1 || prior < 0)
    throw std::invalid_argument("depths, match nodes and context tokens must be >= 1 and the prior >= 0");
}

Core::Request& Core::get(int64_t handle) {
  auto it = requests_.find(handle);
  if (it == requests_.end()) throw std::out_of_range("request handle " + std::to_string(handle) + " is not active");
  return it->second;
}

int64_t Core::start(const std::vector<uint32_t>& prompt) {
  int64_t h = next_handle_++;
  Request& r = requests_[h];
  r.tokens = prompt;
  r.prompt_len = prompt.size();
  r.automaton.extend(prompt.data(), prompt.size());
  return h;
}

void Core::extend(int64_t handle, const std::vector<uint32_t>& tokens) {
  Request& r = get(handle);
  r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.end());
  r.automaton.extend(tokens.data(), tokens.size());
}

std::vector<uint32_t> Core::stop(int64_t handle) {
  Request& r = get(handle);
  std::vector<uint32_t> output(r.tokens.begin() + static_cast<std::ptrdiff_t>(r.prompt_len), r.tokens.end());
  requests_.erase(handle);
  outputs_.add(output);
  return output;
}

std::vector<uint32_t> Core::context(int64_t handle, std::size_t n) const {
  auto it = requests_.find(handle);
  if (it == requests_.end()) throw std::out_of_range("request handle " + std::to_string(handle) + " is not active");
  const auto& t = it->second.tokens;
  n = std::min(t.size(), n);
  return std::vector<uint32_t>(t.end() - static_cast<std::ptrdiff_t>(n), t.end());
}

std::vector<Drafted> Core::draft(const std::vector<StepInput>& inputs, bool chain, double min_score) {
  std::vector<Drafted> out(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) draft_one(get(inputs[i].handle), inputs[i], chain, min_score, out[i]);
  return out;
}

void Core::draft_one(Request& req, const StepInput& in, bool chain, double min_score, Drafted& out) {
  auto t0 = std::chrono::steady_clock::now();
  Scratch& z = scratch_;
  const int nodes = std::max(in.budget, match_nodes_);
  bool has_local = false, has_earlier = false;
  int local_len = 0, earlier_len = 0;
  auto [state, len] = req.automaton.repeated_suffix();
  z.local.clear();
  if (len > 0) {
    req.automaton.continuations(state, nodes, local_depth_, 1, z.local);
    has_local = !z.local.tokens.empty();
    local_len = len;
  }
  {
    std::size_t n = std::min<std::size_t>(req.tokens.size(), static_cast<std::size_t>(context_tokens_));
    has_earlier = outputs_.match(req.tokens.data() + req.tokens.size() - n, n, nodes, z.earlier, earlier_len);
  }
  out.local_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();

  const SourceTree* fixed[kSources] = {nullptr, nullptr, nullptr, nullptr};  // live, local, outputs; ds per candidate
  SourceTree local_view = view(z.local, local_len), earlier_view = view(z.earlier, earlier_len);
  if (in.has_live && in.live.size) fixed[1] = &in.live;
  if (has_local) fixed[2] = &local_view;
  if (has_earlier) fixed[3] = &earlier_view;

  auto& mtok = z.mtok;
  auto& mpar = z.mpar;
  auto& mdepth = z.mdepth;
  auto& x = z.x;
  auto& score = z.score;
  double best_gain = -1.0;
  out.chosen = -1;
  const std::size_t num_candidates = std::max<std::size_t>(in.candidates.size(), 1);
  for (std::size_t ci = 0; ci < num_candidates; ++ci) {
    const SourceTree* cand = ci < in.candidates.size() ? &in.candidates[ci] : nullptr;
    const SourceTree* src[kSources] = {cand && cand->size ? cand : nullptr, fixed[1], fixed[2], fixed[3]};
    // the union: the first present source whole, in its order; then each other source's new nodes
    std::size_t total = 0;
    for (const auto* s : src) total += s ? s->size : 0;
    if (total == 0) continue;
    mtok.clear();
    mpar.clear();
    mdepth.clear();
    z.children.reset(total);
    bool first = true;
    for (int k = 0; k < kSources; ++k) {
      const SourceTree* s = src[k];
      if (!s) continue;
      auto& w = z.where[k];
      w.assign(s->size, 0);
      for (std::size_t i = 0; i < s->size; ++i) {
        int32_t p = s->parents[i];
        if (p < -1 || p >= static_cast<int32_t>(i)) throw std::invalid_argument("a source tree's parents are not a tree");
        int64_t up = p < 0 ? -1 : w[p];
        int32_t* slot = z.children.find_or_slot(up, s->tokens[i]);
        if (first || *slot < 0) {  // the base keeps every node, in order (a repeated sibling: the later is found)
          int32_t node = static_cast<int32_t>(mtok.size());
          mtok.push_back(s->tokens[i]);
          mpar.push_back(static_cast<int32_t>(up));
          mdepth.push_back(up < 0 ? 1 : mdepth[up] + 1);
          *slot = node;
        }
        w[i] = *slot;
      }
      first = false;
    }
    const std::size_t n = mtok.size();
    // the features (decoder.calibration.node_table)
    x.assign(n * kFeatures, 0.0);
    for (int k = 0; k < kSources; ++k) {
      const SourceTree* s = src[k];
      if (!s) continue;
      const auto& w = z.where[k];
      uint64_t root = s->root_count;
      if (root == 0)
        for (std::size_t i = 0; i < s->size; ++i)
          if (s->parents[i] < 0) root += s->counts[i];
      const double log_n = std::log1p(static_cast<double>(s->ngram_len));
      z.has_kids.assign(n + 1, 0);
      for (std::size_t i = 0; i < s->size; ++i) {
        int32_t p = s->parents[i];
        double pc = p < 0 ? static_cast<double>(root) : static_cast<double>(s->counts[p]);
        double ratio = static_cast<double>(s->counts[i]) / (pc + prior_);
        double lp = std::log1p(pc);
        double* row = &x[static_cast<std::size_t>(w[i]) * kFeatures + k * kBlock];
        row[0] = 1.0;
        row[1] = ratio;
        row[2] = lp;
        row[3] = ratio * lp;
        row[4] = log_n;
        z.has_kids[mpar[w[i]] + 1] = 1;
      }
      for (std::size_t m = 0; m < n; ++m) {
        double* row = &x[m * kFeatures + k * kBlock];
        row[5] = (row[0] == 0.0 && z.has_kids[mpar[m] + 1]) ? 1.0 : 0.0;
      }
    }
    score.assign(n, 0.0);
    for (std::size_t m = 0; m < n; ++m) {
      double* row = &x[m * kFeatures];
      double on = 0.0;
      for (int k = 0; k < kSources; ++k) on += row[k * kBlock];
      row[kAgree] = std::max(on - 1.0, 0.0);
      row[kLogDepth] = std::log(static_cast<double>(mdepth[m]));
      double zsum = intercept_;
      for (int j = 0; j < kFeatures; ++j) {
        double term = coef_[j] * row[j];
        zsum = zsum + term;
      }
      double cond = 1.0 / (1.0 + std::exp(-zsum));
      score[m] = mpar[m] < 0 ? cond : cond * score[mpar[m]];
    }
    // the cut (decoder.treeops.best_path / top_nodes)
    Drafted& c = z.candidate;
    c.tokens.clear();
    c.parents.clear();
    c.scores.clear();
    if (chain) {
      z.sum.assign(n, 0.0);
      z.reached.assign(n, 0);
      int64_t best = -1;
      double best_sum = 0.0;
      for (std::size_t m = 0; m < n; ++m) {
        if (!(score[m] >= min_score) || mdepth[m] > in.budget) continue;
        int32_t p = mpar[m];
        if (p >= 0 && !z.reached[p]) continue;
        double t = score[m] + (p < 0 ? 0.0 : z.sum[p]);
        z.sum[m] = t;
        z.reached[m] = 1;
        if (t > best_sum) {
          best = static_cast<int64_t>(m);
          best_sum = t;
        }
      }
      z.path.clear();
      for (int64_t v = best; v >= 0; v = mpar[v]) z.path.push_back(v);
      std::reverse(z.path.begin(), z.path.end());
      for (std::size_t j = 0; j < z.path.size(); ++j) {
        c.tokens.push_back(mtok[z.path[j]]);
        c.parents.push_back(static_cast<int32_t>(j) - 1);
        c.scores.push_back(score[z.path[j]]);
      }
    } else {
      auto& order = z.order;
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (score[a] != score[b]) return score[a] > score[b];
        if (mdepth[a] != mdepth[b]) return mdepth[a] < mdepth[b];
        return a < b;
      });
      if (order.size() > static_cast<std::size_t>(in.budget)) order.resize(in.budget);
      if (min_score > 0)
        order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t m) { return !(score[m] >= min_score); }),
                    order.end());
      z.renumber.assign(n, -1);
      for (std::size_t j = 0; j < order.size(); ++j) z.renumber[order[j]] = static_cast<int32_t>(j);
      for (int32_t m : order) {
        c.tokens.push_back(mtok[m]);
        c.parents.push_back(mpar[m] < 0 ? -1 : z.renumber[mpar[m]]);
        c.scores.push_back(score[m]);
      }
    }
    double gain = 0.0;
    for (double v : c.scores) gain += v;
    if (gain > best_gain) {
      best_gain = gain;
      out.tokens = c.tokens;
      out.parents = c.parents;
      out.scores = c.scores;
      out.chosen = cand ? static_cast<int64_t>(ci) : -1;
    }
  }
  out.merge_s = seconds_since(t1);
}

}  // namespace crest
