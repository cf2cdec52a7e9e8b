#include "online.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace crest {

namespace {

// Solve a x = b in place (a: [n, n] symmetric positive definite, overwritten by its Cholesky factor; b: [n], the
// solution). False when a is not positive definite (the step is skipped).
bool cholesky_solve(std::vector<double>& a, std::vector<double>& b, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (std::size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0.0)) return false;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (std::size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (std::size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / d;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {  // L y = b
    double s = b[i];
    for (std::size_t k = 0; k < i; ++k) s -= a[i * n + k] * b[k];
    b[i] = s / a[i * n + i];
  }
  for (std::size_t i = n; i-- > 0;) {  // L^T x = y
    double s = b[i];
    for (std::size_t k = i + 1; k < n; ++k) s -= a[k * n + i] * b[k];
    b[i] = s / a[i * n + i];
  }
  return true;
}

}  // namespace

OnlineFit::OnlineFit(const Calibration& prior, OnlineOptions options)
    : prior_(prior), now_(prior), options_(options), width_(prior.coef.size() + 1) {
  h_.assign(width_ * width_, 0.0);
  g_.assign(width_, 0.0);
  keep_ = std::exp(-1.0 / options_.memory);
}

namespace {

constexpr int64_t kStateMagic = 0x3174696645455243;  // "CREEFit1", little-endian

void put(std::string& out, const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); }

}  // namespace

std::string OnlineFit::state() const {
  std::string out;
  const int64_t head[4] = {kStateMagic, static_cast<int64_t>(width_), outcomes_, pending_};
  put(out, head, sizeof head);
  put(out, now_.coef.data(), now_.coef.size() * sizeof(double));
  put(out, &now_.intercept, sizeof(double));
  for (double v : h_) {  // the sums as they weigh now: held divided by the scale
    const double u = v * scale_;
    put(out, &u, sizeof u);
  }
  for (double v : g_) {
    const double u = v * scale_;
    put(out, &u, sizeof u);
  }
  return out;
}

void OnlineFit::restore(const std::string& state) {
  const std::size_t w = width_, want = 4 * sizeof(int64_t) + (w + w * w + w) * sizeof(double);
  int64_t head[4];
  if (state.size() != want || (std::memcpy(head, state.data(), sizeof head), head[0] != kStateMagic) ||
      head[1] != static_cast<int64_t>(w) || head[2] < 0 || head[3] < 0)
    throw std::invalid_argument("the fleet's fit is not a state of a fit of " + std::to_string(w - 1) +
                                " weights (another calibration's, or damaged)");
  std::vector<double> v((w + w * w + w));
  std::memcpy(v.data(), state.data() + sizeof head, v.size() * sizeof(double));
  for (double x : v)
    if (!std::isfinite(x)) throw std::invalid_argument("the fleet's fit holds NaN or inf (damaged)");
  now_.coef.assign(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(w - 1));
  now_.intercept = v[w - 1];
  h_.assign(v.begin() + static_cast<std::ptrdiff_t>(w), v.begin() + static_cast<std::ptrdiff_t>(w + w * w));
  g_.assign(v.begin() + static_cast<std::ptrdiff_t>(w + w * w), v.end());
  scale_ = 1.0;
  outcomes_ = head[2];
  pending_ = head[3];
}

std::string OnlineFit::fold(const std::string* fleet) {
  OnlineFit merged(prior_, options_);
  if (fleet) merged.restore(*fleet);
  const std::size_t m = width_ - 1;
  for (std::size_t i = 0; i < kept_offsets_.size(); ++i)
    merged.learn(&kept_x_[i * m], kept_offsets_[i], kept_accepted_[i] != 0);
  merged.unshared_ = unshared_;
  *this = std::move(merged);
  return state();
}

void OnlineFit::add(const double* x, double offset, bool accepted) {
  const std::size_t m = width_ - 1;
  if (static_cast<int64_t>(kept_offsets_.size()) < options_.share) {
    kept_x_.insert(kept_x_.end(), x, x + m);
    kept_offsets_.push_back(offset);
    kept_accepted_.push_back(accepted ? 1 : 0);
  } else if (options_.share > 0) {
    ++unshared_;
  }
  learn(x, offset, accepted);
}

void OnlineFit::learn(const double* x, double offset, bool accepted) {
  const std::size_t w = width_, m = w - 1;
  nonzero_.clear();
  double z = now_.intercept + offset;
  for (std::size_t j = 0; j < m; ++j)
    if (x[j] != 0.0) z += now_.coef[j] * x[j], nonzero_.push_back(j);
  nonzero_.push_back(m);  // the intercept's column, its feature 1
  const double p = 1.0 / (1.0 + std::exp(-z));
  scale_ *= keep_;  // every earlier outcome forgotten a little: the sums are held divided by the scale
  if (scale_ < 1e-100) {
    for (double& v : h_) v *= scale_;
    for (double& v : g_) v *= scale_;
    scale_ = 1.0;
  }
  const double weight = p * (1.0 - p) / scale_, residual = ((accepted ? 1.0 : 0.0) - p) / scale_;
  for (std::size_t i : nonzero_) {
    const double xi = i < m ? x[i] : 1.0;
    g_[i] += residual * xi;
    double* row = &h_[i * w];
    const double wxi = weight * xi;
    for (std::size_t j : nonzero_) row[j] += wxi * (j < m ? x[j] : 1.0);
  }
  ++outcomes_;
  if (++pending_ >= options_.refit_every) refit();
}

void OnlineFit::refit() {
  pending_ = 0;
  const std::size_t w = width_, m = w - 1;
  scratch_.resize(w * w);
  step_.resize(w);
  for (std::size_t i = 0; i < w * w; ++i) scratch_[i] = h_[i] * scale_;
  for (std::size_t i = 0; i < w; ++i) {
    scratch_[i * w + i] += options_.strength;
    const double now = i < m ? now_.coef[i] : now_.intercept, prior = i < m ? prior_.coef[i] : prior_.intercept;
    step_[i] = g_[i] * scale_ - options_.strength * (now - prior);
  }
  if (!cholesky_solve(scratch_, step_, w)) return;
  for (std::size_t i = 0; i < w; ++i) {
    if (i < m) now_.coef[i] += step_[i]; else now_.intercept += step_[i];
    double used = 0.0;  // S_g -= S_H step (both held divided by the scale)
    for (std::size_t j = 0; j < w; ++j) used += h_[i * w + j] * step_[j];
    g_[i] -= used;
  }
}

}  // namespace crest
