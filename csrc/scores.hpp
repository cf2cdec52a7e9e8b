// Stage 5 of drafting: the calibrated scores. A logistic model of a node's acceptance given its parent's (fitted by
// benchmarks/calibrate.py, shipped in drafting/data/calibration.json) scores each node's features; a node's score is
// the product of the conditionals along its path, its estimated probability of being accepted, so scores never rise
// along a path and a draft's expected accepted length is the sum of its scores. A calibration may add a bias per
// drafted token (drafting.calibration.TokenBias), added to the logit after the features' terms. Its Python oracle is
// tests/oracle/calibration.py `scores`: the terms summed in feature order, then the token's bias, the C library's exp,
// the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "merge.hpp"
#include "tree.hpp"

namespace crest {

struct Calibration {
  std::vector<double> coef;  // [kNumFeatures], by crest_native.FEATURES
  double intercept = 0.0;
  double prior = 1.0;  // the count-ratio smoothing the features are computed with
  std::vector<int64_t> bias_tokens;  // [T] ascending token ids with a logit bias (empty: no token term)
  std::vector<double> token_bias;    // [T] their biases
};


// Each node's P(accepted): `x` is the [u.size(), kNumFeatures] feature table of `u` over `sources` (one per Source;
// nullptr or no nodes: absent). An absent source's columns are all 0 and are not summed (adding a zero term changes no
// bit of the conditional).
void scores(const Calibration& cal, const std::vector<const SourceTree*>& sources, const Union& u,
            const std::vector<double>& x, std::vector<double>& out);

}  // namespace crest
