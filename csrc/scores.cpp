#include "scores.hpp"

#include <algorithm>
#include <cmath>

#include "features.hpp"

namespace crest {

void model_features(const ModelView& m, const float* state, const Union& u, std::vector<double>& out) {
  out.assign(u.size() * kNumModelFeatures, 0.0);
  double top = -HUGE_VAL;
  for (std::size_t n = 0; n < u.size(); ++n) {  // the logits of the depth-1 nodes whose token is a row of the head
    if (u.depths[n] != 1 || u.tokens[n] < 0 || static_cast<std::size_t>(u.tokens[n]) >= m.vocab) continue;
    const float* w = m.lm_head + static_cast<std::size_t>(u.tokens[n]) * m.d;
    double z = 0.0;
    for (std::size_t j = 0; j < m.d; ++j) z += static_cast<double>(w[j]) * static_cast<double>(state[j]);
    out[n * kNumModelFeatures] = 1.0, out[n * kNumModelFeatures + 1] = z;
    top = std::max(top, z);
  }
  double total = 0.0;
  for (std::size_t n = 0; n < u.size(); ++n)
    if (out[n * kNumModelFeatures] != 0.0) total += std::exp(out[n * kNumModelFeatures + 1] - top);
  const double log_total = top + std::log(total);
  for (std::size_t n = 0; n < u.size(); ++n) {
    double* row = &out[n * kNumModelFeatures];
    if (row[0] == 0.0) continue;
    row[2] = row[1] == top ? 1.0 : 0.0;
    row[1] = row[1] - log_total;
  }
}

void scores(const Calibration& cal, const std::vector<const SourceTree*>& sources, const Union& u,
            const std::vector<double>& x, std::vector<double>& out, const double* model) {
  int columns[kNumFeatures];  // the columns summed, in feature order: the present sources' blocks, then the shared ones
  int used = 0;
  for (int k = 0; k < kNumSources; ++k)
    if (sources[k] && sources[k]->size)
      for (int c = 0; c < kBlock; ++c) columns[used++] = k * kBlock + c;
  columns[used++] = kAgree;
  columns[used++] = kLogDepth;
  out.assign(u.size(), 0.0);
  const bool has_tokens = !cal.bias_tokens.empty();
  for (std::size_t m = 0; m < u.size(); ++m) {
    const double* row = &x[m * kNumFeatures];
    double z = cal.intercept;
    for (int i = 0; i < used; ++i) {
      double term = cal.coef[columns[i]] * row[columns[i]];
      z = z + term;
    }
    if (model)
      for (int j = 0; j < kNumModelFeatures; ++j) z = z + cal.coef[kNumFeatures + j] * model[m * kNumModelFeatures + j];
    if (has_tokens) {  // the token's bias, where it has one
      auto at = std::lower_bound(cal.bias_tokens.begin(), cal.bias_tokens.end(), u.tokens[m]);
      if (at != cal.bias_tokens.end() && *at == u.tokens[m]) z = z + cal.token_bias[at - cal.bias_tokens.begin()];
    }
    double conditional = 1.0 / (1.0 + std::exp(-z));
    out[m] = u.parents[m] < 0 ? conditional : conditional * out[u.parents[m]];
  }
}

}  // namespace crest
