#include "head.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CREST_X86 1
#endif

namespace crest {

namespace {

// y[r, :m] += sum_i x[r, i] * w[i, :m] for r < n, the weights packed in binary16 panels of kCols columns (pack):
// each panel is read once for every kRows rows of the batch, its products summed in float32 registers.
void accumulate_plain(const float* x, std::size_t k, const uint16_t* panels, std::size_t m, std::size_t n, float* y) {
  float acc[kCols];
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t p = 0; p * kCols < m; ++p) {
      const uint16_t* w = panels + p * k * kCols;
      std::fill(acc, acc + kCols, 0.0f);
      for (std::size_t i = 0; i < k; ++i) {
        const float a = x[r * k + i];
        for (std::size_t c = 0; c < kCols; ++c) acc[c] += a * from_half(w[i * kCols + c]);
      }
      const std::size_t cols = std::min(kCols, m - p * kCols);
      for (std::size_t c = 0; c < cols; ++c) y[r * m + p * kCols + c] += acc[c];
    }
}

#ifdef CREST_X86
// R rows against P panels: out[(r * P + q) * kCols + c] = sum_i x[r, i] * w_q[i, c], where w_q = w + q * stride. Each
// column's products are summed in the order of i whatever R and P are, so a row's estimate never depends on the rows
// or panels beside it; R * P <= 4 keeps 8 independent sums in flight (two FMAs a cycle, four cycles each) for any batch.
template <int R, int P>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const float* x, std::size_t k, const uint16_t* w,
                                                        std::size_t stride, float* out) {
  __m256 acc[R][P][2];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < P; ++q) acc[r][q][0] = acc[r][q][1] = _mm256_setzero_ps();
  for (std::size_t i = 0; i < k; ++i) {
    __m256 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm256_broadcast_ss(x + r * k + i);
    for (int q = 0; q < P; ++q) {  // a panel row: 16 halves, widened to two vectors of 8 floats
      const uint16_t* row = w + q * stride + i * kCols;
      // 2 KiB ahead in the panel, one line in two rows: where 3-4 rows share a panel, its reads from memory then
      // overlap their products (8 rows, cold caches: 0.47-0.49 ms against 0.55-0.59 without, AMD EPYC Zen 4)
      if (R >= 3 && (i & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(row + 1024), _MM_HINT_T0);
      const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
      const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8)));
      for (int r = 0; r < R; ++r) {
        acc[r][q][0] = _mm256_fmadd_ps(a[r], w0, acc[r][q][0]);
        acc[r][q][1] = _mm256_fmadd_ps(a[r], w1, acc[r][q][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < P; ++q) {
      _mm256_storeu_ps(out + (r * P + q) * kCols, acc[r][q][0]);
      _mm256_storeu_ps(out + (r * P + q) * kCols + 8, acc[r][q][1]);
    }
}

// One tile of `rows` rows (1..kRows) against up to `left` panels from w; returns the panels it took.
__attribute__((target("avx2,fma,f16c"))) std::size_t tile_of(std::size_t rows, std::size_t left, const float* x,
                                                              std::size_t k, const uint16_t* w, float* out) {
  const std::size_t stride = k * kCols;
  if (rows == 1 && left >= 4) {
    tile_avx2<1, 4>(x, k, w, stride, out);
    return 4;
  }
  if (rows <= 2 && left >= 2) {
    if (rows == 1) tile_avx2<1, 2>(x, k, w, stride, out);
    else tile_avx2<2, 2>(x, k, w, stride, out);
    return 2;
  }
  switch (rows) {
    case 1: tile_avx2<1, 1>(x, k, w, stride, out); break;
    case 2: tile_avx2<2, 1>(x, k, w, stride, out); break;
    case 3: tile_avx2<3, 1>(x, k, w, stride, out); break;
    default: tile_avx2<4, 1>(x, k, w, stride, out); break;
  }
  return 1;
}

__attribute__((target("avx2,fma,f16c"))) void accumulate_avx2(const float* x, std::size_t k, const uint16_t* panels,
                                                              std::size_t m, std::size_t n, float* y) {
  constexpr std::size_t kGroup = 4;  // panels read from memory once, then from the cache for every kRows rows
  alignas(32) float tile[kRows * kCols];
  const std::size_t count = (m + kCols - 1) / kCols;
  for (std::size_t g = 0; g < count; g += kGroup) {
    const std::size_t end = std::min(count, g + kGroup);
    for (std::size_t r0 = 0; r0 < n; r0 += kRows) {
      const std::size_t rows = std::min(kRows, n - r0);
      for (std::size_t p = g; p < end;) {
        const std::size_t took = tile_of(rows, end - p, x + r0 * k, k, panels + p * k * kCols, tile);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t q = 0; q < took; ++q) {
            const std::size_t col = (p + q) * kCols, cols = std::min(kCols, m - col);
            for (std::size_t c = 0; c < cols; ++c) y[(r0 + r) * m + col + c] += tile[(r * took + q) * kCols + c];
          }
        p += took;
      }
    }
  }
}
#endif

bool detect_avx2() {
#ifdef CREST_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const bool kAvx2 = detect_avx2();

void accumulate(const float* x, std::size_t k, const uint16_t* w, std::size_t m, std::size_t n, float* y) {
#ifdef CREST_X86
  if (kAvx2) return accumulate_avx2(x, k, w, m, n, y);
#endif
  accumulate_plain(x, k, w, m, n, y);
}

// out[:d] = v / sqrt(mean(v^2) + 1e-6) * gain
void rms_gain(const float* v, const float* gain, std::size_t d, float* out) {
  double sum = 0.0;
  for (std::size_t j = 0; j < d; ++j) sum += static_cast<double>(v[j]) * v[j];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(d) + 1e-6));
  for (std::size_t j = 0; j < d; ++j) out[j] = v[j] * inv * gain[j];
}

}  // namespace

bool head_uses_avx2() { return kAvx2; }

uint16_t to_half(float value) {
  uint32_t f;
  std::memcpy(&f, &value, sizeof f);
  const uint32_t sign = (f >> 16) & 0x8000u, bits = f & 0x7fffffffu;
  if (bits >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (bits > 0x7f800000u ? 0x200u : 0u));
  if (bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (bits < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), rounded to nearest even
    if (bits < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t mant = (bits & 0x7fffffu) | 0x800000u, shift = 126u - (bits >> 23);  // 14..24
    const uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    return static_cast<uint16_t>(sign | (half + (rest > mid || (rest == mid && (half & 1u)))));
  }
  const uint32_t half = ((bits - 0x38000000u) >> 13), rest = bits & 0x1fffu;  // rebias the exponent, keep 10 bits
  return static_cast<uint16_t>(sign | (half + (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))));
}

float from_half(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16, exp = (half >> 10) & 0x1fu, mant = half & 0x3ffu;
  uint32_t f;
  if (exp == 0x1fu) {
    f = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    f = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    f = sign;
  } else {  // subnormal: normalise
    uint32_t e = 113u, m = mant;
    while (!(m & 0x400u)) m <<= 1, --e;
    f = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &f, sizeof out);
  return out;
}

namespace {

// w [k, m] row-major in panels of kCols columns, each [k, kCols] contiguous, zero-padded, in binary16.
std::vector<uint16_t> pack_panels(const float* w, std::size_t k, std::size_t m) {
  const std::size_t panels = (m + kCols - 1) / kCols;
  std::vector<uint16_t> out(panels * k * kCols, 0);
  for (std::size_t p = 0; p < panels; ++p)
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t c = 0; c < kCols && p * kCols + c < m; ++c)
        out[(p * k + i) * kCols + c] = to_half(w[i * m + p * kCols + c]);
  return out;
}

}  // namespace

void Head::pack(const float* up, const float* down) {
  up_panels = pack_panels(up, 2 * d, hidden);
  down_panels = pack_panels(down, hidden, d);
  check();
}

void Head::check() const {
  const auto need = [](const std::vector<float>& v, std::size_t size, const char* name) {
    if (v.size() != size)
      throw std::invalid_argument(std::string("the head's ") + name + " holds " + std::to_string(v.size()) +
                                  " values, expected " + std::to_string(size) + "; retrain the head");
  };
  if (d == 0 || hidden == 0) throw std::invalid_argument("the head is empty; retrain it");
  const auto panels = [](std::size_t m) { return (m + kCols - 1) / kCols * kCols; };
  if (up_panels.size() != 2 * d * panels(hidden) || down_panels.size() != hidden * panels(d))
    throw std::invalid_argument("the head's up and down are not packed for its widths; pack them (Head::pack)");
  need(up_bias, hidden, "up_bias");
  need(down_bias, d, "down_bias");
  need(state_gain, d, "state_gain");
  need(token_gain, d, "token_gain");
  if (!embedding || vocab == 0) throw std::invalid_argument("the head's token embedding is empty");
}

void Head::forward(const float* states, const uint32_t* tokens, std::size_t n, float* out,
                   std::vector<float>& scratch) const {
  const std::size_t in = 2 * d;
  scratch.resize(n * (in + hidden));
  float* x = scratch.data();       // [n, 2d]: the normed state and token, gained
  float* h = x + n * in;           // [n, hidden]
  for (std::size_t r = 0; r < n; ++r) {
    rms_gain(states + r * d, state_gain.data(), d, x + r * in);
    rms_gain(embedding + static_cast<std::size_t>(tokens[r]) * d, token_gain.data(), d, x + r * in + d);
    std::copy(up_bias.begin(), up_bias.end(), h + r * hidden);
  }
  accumulate(x, in, up_panels.data(), hidden, n, h);
  for (std::size_t i = 0; i < n * hidden; ++i) h[i] = h[i] / (1.0f + std::exp(-h[i]));  // silu
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t j = 0; j < d; ++j) out[r * d + j] = states[r * d + j] + down_bias[j];
  accumulate(h, hidden, down_panels.data(), d, n, out);
}

}  // namespace crest
