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
  std::vector<double> coef;  // [kNumFeatures], by crest_native.FEATURES (+ kNumModelFeatures: a with-model one)
  double intercept = 0.0;
  double prior = 1.0;  // the count-ratio smoothing the features are computed with
  std::vector<int64_t> bias_tokens;  // [T] ascending token ids with a logit bias (empty: no token term)
  std::vector<double> token_bias;    // [T] their biases
};


// The target's own view of a row's next token (issue 69; EAGLE's feature-level step, Li et al. 2024, section 3): an
// estimate of the row's next final-normed hidden state, read against the LM head's rows of the union's depth-1 tokens
// only (never the vocabulary). Per node three model features, after the kNumFeatures: whether it is scored (a depth-1
// node whose token is a row of the head), its log-probability among the scored depth-1 nodes (a softmax over their
// logits), and whether it is their argmax; 0 for every other node.
constexpr int kNumModelFeatures = 3;
constexpr const char* kModelFeatureNames[kNumModelFeatures] = {"model_on", "model_logp", "model_top"};

struct ModelView {
  const float* lm_head = nullptr;  // [vocab, d] float32, row-major, borrowed (nullptr: no model)
  std::size_t vocab = 0, d = 0;
};

// The model features of `u`'s nodes given the row's next-state estimate `state` ([m.d]): [u.size(), kNumModelFeatures].
void model_features(const ModelView& m, const float* state, const Union& u, std::vector<double>& out);

// Each node's P(accepted): `x` is the [u.size(), kNumFeatures] feature table of `u` over `sources` (one per Source;
// nullptr or no nodes: absent). An absent source's columns are all 0 and are not summed (adding a zero term changes no
// bit of the conditional). `model` ([u.size(), kNumModelFeatures], or nullptr): the model features, weighed by
// cal.coef[kNumFeatures...] after the features' terms and before the token's bias.
void scores(const Calibration& cal, const std::vector<const SourceTree*>& sources, const Union& u,
            const std::vector<double>& x, std::vector<double>& out, const double* model = nullptr);

}  // namespace crest
