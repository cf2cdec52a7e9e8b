// Stage 4 of drafting: the features of every node of the merged table, what the calibration scores (the merged
// drafter's own method; docs/drafter-quality.md section 1). The sources, in union order, and the columns are named
// here once: the calibration file is checked against these names when it loads (crest_native.FEATURES).
//
// Per source, a block of six columns. A counted source's (the datastore's, the live layer's, the request's own, the
// outputs'): whether the node is in it, its count ratio to its parent (smoothed by the prior), the parent's count
// (log1p), their product, the matched context's length (log1p) and whether the source predicted other continuations
// of the node's parent and not this one. Then how many other sources agree and the node's depth (log). Its Python oracle is tests/oracle/calibration.py `node_table`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "merge.hpp"
#include "tree.hpp"

namespace crest {

// The merged drafter's sources, in union order.
enum Source : int {
  kDatastore = 0,  // the corpus datastore's tree of the chosen n-gram (CREST)
  kLive = 1,       // the shared live layer's: every process's earlier outputs, compacted
  kLocal = 2,      // the request's own tokens (stage 1)
  kOutputs = 3,    // this process's finished outputs (stage 2)
  kNumSources = 4,
};
static_assert(kNumSources <= 8, "a node's sources are one byte's bits (holders)");
constexpr const char* kSourceNames[kNumSources] = {"ds", "live", "local", "outputs"};
constexpr int kBlock = 6;
constexpr const char* kBlockNames[kBlock] = {"on", "ratio", "log_parent", "ratio_x_log_parent", "log_n", "miss"};
constexpr int kNumFeatures = kNumSources * kBlock + 2;
constexpr int kAgree = kNumSources * kBlock;
constexpr int kLogDepth = kAgree + 1;

// "ds_on", "ds_ratio", ... "outputs_miss", "agree", "log_depth": column j's name.
std::vector<std::string> feature_names();

// The features of `u`'s nodes, row-major [u.size(), kNumFeatures], from its sources (one per Source; nullptr or
// no nodes: absent). `prior` smooths the count ratios; `has_kids` is scratch. Only the present sources' blocks and
// the shared columns are written: an absent source's block holds what it held (its features are all 0, which
// zero_absent writes where a whole table is read; the scores read only the present sources' columns).
void features(const std::vector<const SourceTree*>& sources, const Union& u, double prior, std::vector<double>& x,
              std::vector<uint8_t>& has_kids);

// The sources whose trees hold node `m` of the table `x` (features of the present `sources`): bit k for Source k.
uint8_t holders(const std::vector<const SourceTree*>& sources, const std::vector<double>& x, std::size_t m);

// Zero the blocks of the absent sources in `x` (a table of features): the whole table, as its oracle gives it.
void zero_absent(const std::vector<const SourceTree*>& sources, std::vector<double>& x);

}  // namespace crest
