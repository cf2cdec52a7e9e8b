#include "core.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace crest {

namespace {

std::string describe(const RequestKey& key) {
  if (const auto* i = std::get_if<int64_t>(&key)) return std::to_string(*i);
  return "'" + std::get<std::string>(key) + "'";
}

}  // namespace

Core::Core(Calibration calibration, Options options)
    : calibration_(std::move(calibration)), options_(options), outputs_(options.outputs_bytes, options.outputs_depth) {
  if (static_cast<int>(calibration_.coef.size()) != kNumFeatures)
    throw std::invalid_argument("the calibration has " + std::to_string(calibration_.coef.size()) +
                                " weights, the native core's features are " + std::to_string(kNumFeatures));
  const Options& o = options_;
  if (o.local_depth < 1 || o.outputs_depth < 1 || o.match_nodes < 1 || o.context_tokens < 1 || calibration_.prior < 0)
    throw std::invalid_argument("depths, match nodes and context tokens must be >= 1 and the prior >= 0");
  z_.sources.assign(kNumSources, nullptr);
}

Core::Request& Core::get(const RequestKey& key) {
  auto it = requests_.find(key);
  if (it == requests_.end()) throw std::out_of_range("request " + describe(key) + " is not active");
  return it->second;
}

void Core::start(const RequestKey& key, const uint32_t* prompt, std::size_t n) {
  if (requests_.count(key)) throw std::invalid_argument("request " + describe(key) + " is already active");
  Request& r = requests_[key];
  r.tokens.assign(prompt, prompt + n);
  r.prompt_len = n;
  r.automaton.extend(prompt, n);
}

void Core::extend(const RequestKey& key, const uint32_t* tokens, std::size_t n) {
  Request& r = get(key);
  r.tokens.insert(r.tokens.end(), tokens, tokens + n);
  r.automaton.extend(tokens, n);
}

bool Core::follow(const RequestKey& key, const uint32_t* tokens, std::size_t n) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return false;
  Request& r = it->second;
  std::size_t have = r.tokens.size();
  if (have > n || (have && std::memcmp(r.tokens.data(), tokens, have * sizeof(uint32_t)) != 0)) return false;
  r.tokens.insert(r.tokens.end(), tokens + have, tokens + n);
  r.automaton.extend(tokens + have, n - have);
  return true;
}

bool Core::stop(const RequestKey& key, std::vector<uint32_t>& output) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return false;
  const auto& t = it->second.tokens;
  output.assign(t.begin() + static_cast<std::ptrdiff_t>(it->second.prompt_len), t.end());
  requests_.erase(it);
  outputs_.add(output);
  return true;
}

std::vector<RequestKey> Core::keys() const {
  std::vector<RequestKey> out;
  out.reserve(requests_.size());
  for (const auto& kv : requests_) out.push_back(kv.first);
  return out;
}

void Core::gather(Request& r, const StepInput& in, int nodes) {
  const bool* on = options_.sources;
  auto& src = z_.sources;
  std::fill(src.begin(), src.end(), nullptr);
  if (on[kLive] && in.live.size) src[kLive] = &in.live;
  if (on[kHeads] && in.heads.size) src[kHeads] = &in.heads;
  auto [state, len] = r.automaton.repeated_suffix();
  z_.local.clear();
  if (on[kLocal] && len > 0) r.automaton.continuations(state, nodes, options_.local_depth, 1, z_.local);
  z_.local_view = SourceTree::of(z_.local, len);
  if (z_.local_view.size) src[kLocal] = &z_.local_view;
  std::size_t n = std::min<std::size_t>(r.tokens.size(), static_cast<std::size_t>(options_.context_tokens));
  int earlier_len = 0;
  if (on[kOutputs] && outputs_.match(r.tokens.data() + r.tokens.size() - n, n, nodes, z_.earlier, earlier_len))
    src[kOutputs] = &z_.earlier_view;
  z_.earlier_view = SourceTree::of(z_.earlier, earlier_len);
}

bool Core::score_candidate(const SourceTree* candidate) {
  z_.sources[kDatastore] = candidate && candidate->size ? candidate : nullptr;
  if (!merge(z_.sources, z_.children, z_.merged)) return false;
  features(z_.sources, z_.merged, calibration_.prior, z_.x, z_.has_kids);
  scores(calibration_, z_.merged, z_.x, z_.score);
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
  }
}

void Core::draft_one(Request& r, const StepInput& in, bool chain, double min_score, Drafted& out) {
  gather(r, in, std::max(in.budget, options_.match_nodes));
  out.clear();
  double best_gain = -1.0;
  const std::size_t given = options_.sources[kDatastore] ? in.candidates.size() : 0;
  for (std::size_t c = 0; c < std::max<std::size_t>(given, 1); ++c) {  // no candidate: the other sources
    const SourceTree* candidate = c < given ? &in.candidates[c] : nullptr;
    if (!score_candidate(candidate)) continue;
    cut(chain, in.budget, min_score, z_.candidate);
    double gain = 0.0;  // the draft's expected accepted length
    for (double v : z_.candidate.scores) gain += v;
    if (gain > best_gain) {
      best_gain = gain;
      std::swap(out, z_.candidate);
      out.chosen = candidate ? static_cast<int64_t>(c) : -1;
    }
  }
}

void Core::draft(const std::vector<StepInput>& inputs, bool chain, double min_score, std::vector<Drafted>& out) {
  out.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto it = requests_.find(inputs[i].key);
    if (it == requests_.end())
      out[i].clear();  // stopped while its lookups ran: no draft for its row
    else
      draft_one(it->second, inputs[i], chain, min_score, out[i]);
  }
}

void Core::tables(const StepInput& input, std::vector<NodeTable>& out) {
  Request& r = get(input.key);
  gather(r, input, std::max(input.budget, options_.match_nodes));
  out.clear();
  const std::size_t given = options_.sources[kDatastore] ? input.candidates.size() : 0;
  for (std::size_t c = 0; c < std::max<std::size_t>(given, 1); ++c) {
    const SourceTree* candidate = c < given ? &input.candidates[c] : nullptr;
    if (!score_candidate(candidate)) continue;
    out.push_back({z_.merged, z_.x, z_.score});
  }
}

}  // namespace crest
