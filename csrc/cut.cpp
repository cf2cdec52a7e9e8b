#include "cut.hpp"

#include <algorithm>
#include <numeric>

namespace crest {

void chain_cut(const Scored& t, int max_len, double min_score, CutScratch& z, std::vector<int32_t>& path) {
  z.sum.assign(t.n, 0.0);
  z.reached.assign(t.n, 0);
  int64_t best = -1;
  double best_sum = 0.0;
  for (std::size_t m = 0; m < t.n; ++m) {
    if (!(t.scores[m] >= min_score) || t.depths[m] > max_len) continue;
    int32_t p = t.parents[m];
    if (p >= 0 && !z.reached[p]) continue;
    double total = t.scores[m] + (p < 0 ? 0.0 : z.sum[p]);
    z.sum[m] = total;
    z.reached[m] = 1;
    if (total > best_sum) {
      best = static_cast<int64_t>(m);
      best_sum = total;
    }
  }
  path.clear();
  for (int64_t v = best; v >= 0; v = t.parents[v]) path.push_back(static_cast<int32_t>(v));
  std::reverse(path.begin(), path.end());
}

void tree_cut(const Scored& t, int budget, double min_score, CutScratch& z, std::vector<int32_t>& order,
              std::vector<int32_t>& parents) {
  order.resize(t.n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (t.scores[a] != t.scores[b]) return t.scores[a] > t.scores[b];
    if (t.depths[a] != t.depths[b]) return t.depths[a] < t.depths[b];
    return a < b;
  });
  if (order.size() > static_cast<std::size_t>(budget)) order.resize(static_cast<std::size_t>(budget));
  if (min_score > 0)
    order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t m) { return !(t.scores[m] >= min_score); }),
                order.end());
  z.renumber.assign(t.n, -1);
  for (std::size_t j = 0; j < order.size(); ++j) z.renumber[order[j]] = static_cast<int32_t>(j);
  parents.clear();
  for (int32_t m : order) parents.push_back(t.parents[m] < 0 ? -1 : z.renumber[t.parents[m]]);
}

}  // namespace crest
