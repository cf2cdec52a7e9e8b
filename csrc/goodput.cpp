#include "goodput.hpp"

#include <algorithm>
#include <numeric>

namespace crest {

double StepCurve::at(double n) const {
  const std::size_t last = points - 1;
  if (n > tokens[last]) return seconds[last] + tail * (n - tokens[last]);
  if (n <= tokens[0]) return seconds[0];
  const std::size_t j = static_cast<std::size_t>(std::upper_bound(tokens, tokens + points, n) - tokens) - 1;
  if (j >= last) return seconds[last];
  const double slope = (seconds[j + 1] - seconds[j]) / (tokens[j + 1] - tokens[j]);
  return slope * (n - tokens[j]) + seconds[j];
}

std::size_t goodput_keep(const double* scores, std::size_t nodes, int64_t rows, const StepCurve& curve,
                         std::vector<uint8_t>& keep, std::vector<int32_t>& order) {
  order.resize(nodes);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [scores](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  const double base = static_cast<double>(rows);
  double gained = base, best_value = base / curve.at(base);
  std::size_t best = 0;
  for (std::size_t n = 1; n <= nodes; ++n) {
    gained += scores[order[n - 1]];
    const double value = gained / (curve.at(base + static_cast<double>(n)) + curve.jump);
    if (value > best_value) {
      best_value = value;
      best = n;
    }
  }
  keep.assign(nodes, 0);
  for (std::size_t i = 0; i < best; ++i) keep[order[i]] = 1;
  return best;
}

}  // namespace crest
