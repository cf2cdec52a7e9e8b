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

// (merged parent + 1, token) -> merged node, open addressing; cleared per table.
class ChildMap {
 public:
  void reset(std::size_t capacity) {
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
  int32_t* find_or_slot(int64_t parent, uint32_t token, uint64_t& key) {
    key = (static_cast<uint64_t>(parent + 1) << 32) | token;
    for (std::size_t i = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 40) & mask_;; i = (i + 1) & mask_) {
      if (values_[i] < 0) {
        keys_[i] = key;
        return &values_[i];
      }
      if (keys_[i] == key) return &values_[i];
    }
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  std::size_t mask_ = 0;
};

}  // namespace

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
  const int nodes = std::max(in.budget, match_nodes_);
  Tree local, earlier;
  bool has_local = false, has_earlier = false;
  int local_len = 0, earlier_len = 0;
  auto [state, len] = req.automaton.repeated_suffix();
  if (len > 0) {
    req.automaton.continuations(state, nodes, local_depth_, 1, local);
    has_local = !local.tokens.empty();
    local_len = len;
  }
  {
    std::size_t n = std::min<std::size_t>(req.tokens.size(), static_cast<std::size_t>(context_tokens_));
    has_earlier = outputs_.match(req.tokens.data() + req.tokens.size() - n, n, nodes, earlier, earlier_len);
  }
  out.local_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();

  std::vector<const SourceTree*> fixed(kSources, nullptr);  // live, local, outputs (ds per candidate)
  SourceTree local_view = view(local, local_len), earlier_view = view(earlier, earlier_len);
  if (in.has_live && in.live.size) fixed[1] = &in.live;
  if (has_local) fixed[2] = &local_view;
  if (has_earlier) fixed[3] = &earlier_view;

  std::vector<int64_t> mtok;
  std::vector<int32_t> mpar, mdepth;
  std::vector<double> x, score;
  std::vector<uint8_t> has_kids;
  std::vector<int32_t> at;
  std::vector<std::vector<int32_t>> where(kSources);
  ChildMap children;
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
    children.reset(total);
    bool first = true;
    for (int k = 0; k < kSources; ++k) {
      const SourceTree* s = src[k];
      if (!s) continue;
      auto& w = where[k];
      w.assign(s->size, 0);
      for (std::size_t i = 0; i < s->size; ++i) {
        int32_t p = s->parents[i];
        if (p < -1 || p >= static_cast<int32_t>(i)) throw std::invalid_argument("a source tree's parents are not a tree");
        int64_t up = p < 0 ? -1 : w[p];
        uint64_t key;
        int32_t* slot = children.find_or_slot(up, s->tokens[i], key);
        if (first) {  // the base: every node its own, in order (a repeated sibling: the later one is found)
          int32_t node = static_cast<int32_t>(mtok.size());
          mtok.push_back(s->tokens[i]);
          mpar.push_back(static_cast<int32_t>(up));
          mdepth.push_back(up < 0 ? 1 : mdepth[up] + 1);
          *slot = node;
          w[i] = node;
        } else {
          if (*slot < 0) {
            *slot = static_cast<int32_t>(mtok.size());
            mtok.push_back(s->tokens[i]);
            mpar.push_back(static_cast<int32_t>(up));
            mdepth.push_back(up < 0 ? 1 : mdepth[up] + 1);
          }
          w[i] = *slot;
        }
      }
      first = false;
    }
    const std::size_t n = mtok.size();
    // the features (decoder.calibration.node_table)
    x.assign(n * kFeatures, 0.0);
    for (int k = 0; k < kSources; ++k) {
      const SourceTree* s = src[k];
      if (!s) continue;
      const auto& w = where[k];
      uint64_t root = s->root_count;
      if (root == 0)
        for (std::size_t i = 0; i < s->size; ++i)
          if (s->parents[i] < 0) root += s->counts[i];
      const double log_n = std::log1p(static_cast<double>(s->ngram_len));
      has_kids.assign(n + 1, 0);
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
        has_kids[mpar[w[i]] + 1] = 1;
      }
      for (std::size_t m = 0; m < n; ++m) {
        double* row = &x[m * kFeatures + k * kBlock];
        row[5] = (row[0] == 0.0 && has_kids[mpar[m] + 1]) ? 1.0 : 0.0;
      }
    }
    score.assign(n, 0.0);
    for (std::size_t m = 0; m < n; ++m) {
      double* row = &x[m * kFeatures];
      double on = 0.0;
      for (int k = 0; k < kSources; ++k) on += row[k * kBlock];
      row[kAgree] = std::max(on - 1.0, 0.0);
      row[kLogDepth] = std::log(static_cast<double>(mdepth[m]));
      double z = intercept_;
      for (int j = 0; j < kFeatures; ++j) {
        double term = coef_[j] * row[j];
        z = z + term;
      }
      double cond = 1.0 / (1.0 + std::exp(-z));
      score[m] = mpar[m] < 0 ? cond : cond * score[mpar[m]];
    }
    // the cut (decoder.treeops.best_path / top_nodes)
    std::vector<int64_t> ctok;
    std::vector<int32_t> cpar;
    std::vector<double> cscore;
    if (chain) {
      std::vector<double> sum(n, 0.0);
      std::vector<uint8_t> reached(n, 0);
      int64_t best = -1;
      double best_sum = 0.0;
      for (std::size_t m = 0; m < n; ++m) {
        if (!(score[m] >= min_score) || mdepth[m] > in.budget) continue;
        int32_t p = mpar[m];
        if (p >= 0 && !reached[p]) continue;
        double t = score[m] + (p < 0 ? 0.0 : sum[p]);
        sum[m] = t;
        reached[m] = 1;
        if (t > best_sum) {
          best = static_cast<int64_t>(m);
          best_sum = t;
        }
      }
      std::vector<int64_t> path;
      for (int64_t v = best; v >= 0; v = mpar[v]) path.push_back(v);
      std::reverse(path.begin(), path.end());
      for (std::size_t j = 0; j < path.size(); ++j) {
        ctok.push_back(mtok[path[j]]);
        cpar.push_back(static_cast<int32_t>(j) - 1);
        cscore.push_back(score[path[j]]);
      }
    } else {
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (score[a] != score[b]) return score[a] > score[b];
        if (mdepth[a] != mdepth[b]) return mdepth[a] < mdepth[b];
        return a < b;
      });
      if (order.size() > static_cast<std::size_t>(in.budget)) order.resize(in.budget);
      if (min_score > 0) {
        std::vector<int32_t> kept;
        for (int32_t m : order)
          if (score[m] >= min_score) kept.push_back(m);
        order.swap(kept);
      }
      std::vector<int32_t> renumber(n, -1);
      for (std::size_t j = 0; j < order.size(); ++j) renumber[order[j]] = static_cast<int32_t>(j);
      for (int32_t m : order) {
        ctok.push_back(mtok[m]);
        cpar.push_back(mpar[m] < 0 ? -1 : renumber[mpar[m]]);
        cscore.push_back(score[m]);
      }
    }
    double gain = 0.0;
    for (double s : cscore) gain += s;
    if (gain > best_gain) {
      best_gain = gain;
      out.tokens.swap(ctok);
      out.parents.swap(cpar);
      out.scores.swap(cscore);
      out.chosen = cand ? static_cast<int64_t>(ci) : -1;
    }
  }
  out.merge_s = seconds_since(t1);
}

}  // namespace crest
