#include "scores.hpp"

#include <cmath>

#include "features.hpp"

namespace crest {

void scores(const Calibration& cal, const Union& u, const std::vector<double>& x, std::vector<double>& out) {
  out.assign(u.size(), 0.0);
  for (std::size_t m = 0; m < u.size(); ++m) {
    const double* row = &x[m * kNumFeatures];
    double z = cal.intercept;
    for (int j = 0; j < kNumFeatures; ++j) {
      double term = cal.coef[j] * row[j];
      z = z + term;
    }
    double conditional = 1.0 / (1.0 + std::exp(-z));
    out[m] = u.parents[m] < 0 ? conditional : conditional * out[u.parents[m]];
  }
}

}  // namespace crest
