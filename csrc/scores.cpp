#include "scores.hpp"

#include <algorithm>
#include <cmath>

#include "features.hpp"

namespace crest {

void scores(const Calibration& cal, const std::vector<const SourceTree*>& sources, const Union& u,
            const std::vector<double>& x, std::vector<double>& out) {
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
    if (has_tokens) {  // the token's bias, where it has one
      auto at = std::lower_bound(cal.bias_tokens.begin(), cal.bias_tokens.end(), u.tokens[m]);
      if (at != cal.bias_tokens.end() && *at == u.tokens[m]) z = z + cal.token_bias[at - cal.bias_tokens.begin()];
    }
    double conditional = 1.0 / (1.0 + std::exp(-z));
    out[m] = u.parents[m] < 0 ? conditional : conditional * out[u.parents[m]];
  }
}

}  // namespace crest
