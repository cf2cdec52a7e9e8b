#include "features.hpp"

#include <algorithm>
#include <cmath>

namespace crest {

std::vector<std::string> feature_names() {
  std::vector<std::string> names;
  for (int k = 0; k < kNumSources; ++k)
    for (const char* column : kBlockNames)
      names.push_back(std::string(kSourceNames[k]) + "_" + column);
  names.push_back("agree");
  names.push_back("log_depth");
  return names;
}

namespace {

// Column 5 of source k's block: the source predicted other continuations of this node's parent and not this one.
void miss_column(int k, const Union& u, std::vector<double>& x, const std::vector<uint8_t>& has_kids) {
  for (std::size_t m = 0; m < u.size(); ++m) {
    double* row = &x[m * kNumFeatures + k * kBlock];
    row[5] = (row[0] == 0.0 && has_kids[u.parents[m] + 1]) ? 1.0 : 0.0;
  }
}

// A counted source's block: columns 0-4 of its nodes.
void source_block(int k, const SourceTree& s, const std::vector<int32_t>& where, const Union& u, double prior,
                  std::vector<double>& x, std::vector<uint8_t>& has_kids, std::vector<double>& log_count) {
  uint64_t root = s.root_count;
  if (root == 0)
    for (std::size_t i = 0; i < s.size; ++i)
      if (s.parents[i] < 0) root += s.counts[i];
  const double log_n = std::log1p(static_cast<double>(s.ngram_len));
  const double log_root = std::log1p(static_cast<double>(root));
  has_kids.assign(u.size() + 1, 0);
  log_count.assign(s.size, -1.0);  // log1p of a node's count, computed once for all its children
  for (std::size_t i = 0; i < s.size; ++i) {
    if (where[i] < 0) continue;  // left out of the union (deeper than the draft can reach)
    int32_t p = s.parents[i];
    double pc = p < 0 ? static_cast<double>(root) : static_cast<double>(s.counts[p]);
    double ratio = static_cast<double>(s.counts[i]) / (pc + prior);
    double lp = p < 0 ? log_root : log_count[p] >= 0 ? log_count[p] : (log_count[p] = std::log1p(pc));
    double* row = &x[static_cast<std::size_t>(where[i]) * kNumFeatures + k * kBlock];
    row[0] = 1.0;
    row[1] = ratio;
    row[2] = lp;
    row[3] = ratio * lp;
    row[4] = log_n;
    has_kids[u.parents[where[i]] + 1] = 1;
  }
}

}  // namespace

void features(const std::vector<const SourceTree*>& sources, const Union& u, double prior, std::vector<double>& x,
              std::vector<uint8_t>& has_kids) {
  thread_local std::vector<double> log_count, log_depth;  // scratch, and log(d) of the depths seen so far
  x.resize(u.size() * kNumFeatures);
  int present[kNumSources], count = 0;
  for (int k = 0; k < kNumSources; ++k) {
    const SourceTree* s = sources[k];
    if (!s || !s->size) continue;
    present[count++] = k;
    for (std::size_t m = 0; m < u.size(); ++m) std::fill_n(&x[m * kNumFeatures + k * kBlock], kBlock, 0.0);
    source_block(k, *s, u.where[k], u, prior, x, has_kids, log_count);
    miss_column(k, u, x, has_kids);
  }
  for (std::size_t m = 0; m < u.size(); ++m) {
    double* row = &x[m * kNumFeatures];
    double on = 0.0;
    for (int i = 0; i < count; ++i) on += row[present[i] * kBlock];
    row[kAgree] = std::max(on - 1.0, 0.0);
    const int d = u.depths[m];
    while (static_cast<int>(log_depth.size()) <= d) log_depth.push_back(std::log(static_cast<double>(log_depth.size())));
    row[kLogDepth] = log_depth[d];  // log(depth), each computed once
  }
}

uint8_t holders(const std::vector<const SourceTree*>& sources, const std::vector<double>& x, std::size_t m) {
  uint8_t out = 0;
  for (int k = 0; k < kNumSources; ++k)  // an absent source's block holds stale values: read the present ones only
    if (sources[k] && sources[k]->size && x[m * kNumFeatures + k * kBlock] > 0.0) out |= static_cast<uint8_t>(1u << k);
  return out;
}

void zero_absent(const std::vector<const SourceTree*>& sources, std::vector<double>& x) {
  for (int k = 0; k < kNumSources; ++k) {
    if (sources[k] && sources[k]->size) continue;
    for (std::size_t at = static_cast<std::size_t>(k) * kBlock; at < x.size(); at += kNumFeatures)
      std::fill_n(&x[at], kBlock, 0.0);
  }
}

}  // namespace crest
