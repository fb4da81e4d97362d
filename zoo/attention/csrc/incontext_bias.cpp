// InContextAttention's position bias on the CPU: one pass forward, one backward.
//
// For every (batch, head), with the gate sums c_i at the queries ("ends"), c_{j-1} at the keys
// ("starts") and each query's bias table T_i over P contextual positions:
//     p_ij = clamp(c_i - c_{j-1}, 0, P - 1)          for key j at or before query i,
//     p_ij = clamp(c_j - c_{i-1}, 0, P - 1)          for a later key (bidirectional, Lq = Lk),
//     bias_ij = lerp(T_i[floor p], T_i[min(floor p + 1, P - 1)], p - floor p).
// Queries sit at the end of the keys (offset Lk - Lq, as with a KV cache). A causal call puts -inf at
// the later keys, so that the bias is the causal mask as well: they take no value and give no gradient.
// The eager route builds this from about fifteen (B, H, Lq, Lk) tensors (the counts, their
// transpose and clamps, floor, two gathers, lerp) and its backward about as many more, and on
// long sequences its time goes to memory traffic. Here the forward writes the bias once, and the
// backward reads its gradient once, recomputing p from the O(L) sums.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include "checks.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using IVec = at::vec::Vectorized<int32_t>;

struct Shape {
  int64_t B, H, Lq, Lk, P;
};

Shape check_inputs(const char* kernel, const at::Tensor& ends, const at::Tensor& starts, const at::Tensor& tables,
                   bool causal) {
  const auto n = zoo::sizes_of(kernel, "tables", tables, 4);
  const Shape s{n[0], n[1], n[2], zoo::sizes_of(kernel, "starts", starts, 3)[2], n[3]};
  zoo::check_tensor(kernel, "tables", tables, {s.B, s.H, s.Lq, s.P}, {at::kFloat});
  zoo::check_tensor(kernel, "ends", ends, {s.B, s.H, s.Lq}, {at::kFloat});
  zoo::check_tensor(kernel, "starts", starts, {s.B, s.H, s.Lk}, {at::kFloat});
  TORCH_CHECK_VALUE(s.Lk >= s.Lq, kernel, ": the queries sit at the end of the keys, so starts (", s.Lk,
                    " keys) must be at least as long as ends (", s.Lq, " queries)");
  TORCH_CHECK_VALUE(causal || s.Lk == s.Lq, kernel, ": a bidirectional bias needs as many keys as queries, got ",
                    s.Lk, " keys and ", s.Lq, " queries");
  TORCH_CHECK_VALUE(s.P >= 1, kernel, ": tables must have at least one position, got ", s.P);
  return s;
}

// The interpolation point of a count: the table entries either side and the weight of the upper one.
struct Point {
  int64_t low, high;
  float weight;
};

// A NaN count (from NaN activations) reads entry 0 and gives a NaN weight, so NaN comes out: never an index
// outside the table.
inline Point locate(float count, int64_t P) {
  const float p = std::min(std::max(count, 0.0f), static_cast<float>(P - 1));
  const int64_t low = p > 0.0f ? static_cast<int64_t>(p) : 0;  // p >= 0: truncation is floor
  return {low, std::min(low + 1, P - 1), p - static_cast<float>(low)};
}

// torch.lerp's own formula, so that the two routes round alike.
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

inline Vec lerp(const Vec& a, const Vec& b, const Vec& w) {
  const Vec d = b - a;
  return Vec::blendv(b - d * (Vec(1.0f) - w), a + w * d, w < Vec(0.5f));
}

inline float interpolate(float count, const float* T, int64_t P) {
  const Point at = locate(count, P);
  return lerp(T[at.low], T[at.high], at.weight);
}

// One entry's gradient g: into its table row gT, and returned as the gradient of its count, g times the slope
// between the two entries strictly inside the clamps (0 on them, as torch.clamp's gradient is; a padded
// token's own count is exactly 0).
inline float count_gradient(float count, float g, const float* T, float* gT, int64_t P) {
  const Point at = locate(count, P);
  gT[at.low] += g * (1.0f - at.weight);
  gT[at.high] += g * at.weight;
  return count > 0.0f && count < static_cast<float>(P - 1) ? g * (T[at.high] - T[at.low]) : 0.0f;
}

}  // namespace

// ends (B, H, Lq), starts (B, H, Lk), tables (B, H, Lq, P) -> bias (B, H, Lq, Lk)
at::Tensor incontext_bias_forward(const at::Tensor& ends, const at::Tensor& starts, const at::Tensor& tables,
                                  bool causal) {
  const Shape s = check_inputs("incontext_bias_forward", ends, starts, tables, causal);
  auto bias = at::empty({s.B, s.H, s.Lq, s.Lk}, tables.options());
  const float* ep = ends.data_ptr<float>();
  const float* sp = starts.data_ptr<float>();
  const float* tp = tables.data_ptr<float>();
  float* out = bias.data_ptr<float>();
  const int64_t offset = s.Lk - s.Lq;
  at::parallel_for(0, s.B * s.H * s.Lq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t bh = row / s.Lq, i = row % s.Lq;
      const float* T = tp + row * s.P;
      const float* starts_bh = sp + bh * s.Lk;
      const float* ends_bh = ep + bh * s.Lq;
      float* o = out + row * s.Lk;
      const float c = ends_bh[i];
      const int64_t last = i + offset;  // the query's own key
      int64_t j = 0;
      for (; j + Vec::size() <= last + 1; j += Vec::size()) {
        const Vec p = at::vec::clamp(Vec(c) - Vec::loadu(starts_bh + j), Vec(0.0f), Vec(static_cast<float>(s.P - 1)));
        // truncation, which is floor for p >= 0; a NaN count converts to INT_MIN, kept inside the table
        const IVec low = at::vec::maximum(at::vec::convert_to_int_of_same_size(p), IVec(0));
        const IVec high = at::vec::minimum(low + IVec(1), IVec(static_cast<int32_t>(s.P - 1)));
        lerp(at::vec::gather<sizeof(float)>(T, low), at::vec::gather<sizeof(float)>(T, high), p - p.trunc())
            .store(o + j);
      }
      for (; j <= last; ++j) o[j] = interpolate(c - starts_bh[j], T, s.P);
      for (j = last + 1; j < s.Lk; ++j) {  // non-causal: Lq = Lk, the gates from the query to the later key j
        o[j] = causal ? -std::numeric_limits<float>::infinity() : interpolate(ends_bh[j] - starts_bh[i], T, s.P);
      }
    }
  });
  return bias;
}

// The gradient of the bias -> the gradients of ends, starts and tables.
std::vector<at::Tensor> incontext_bias_backward(const at::Tensor& grad, const at::Tensor& ends,
                                                const at::Tensor& starts, const at::Tensor& tables, bool causal) {
  const Shape s = check_inputs("incontext_bias_backward", ends, starts, tables, causal);
  zoo::check_tensor("incontext_bias_backward", "grad", grad, {s.B, s.H, s.Lq, s.Lk}, {at::kFloat});
  auto g_ends = at::zeros_like(ends);
  auto g_starts = at::zeros_like(starts);
  auto g_tables = at::zeros_like(tables);
  const float* gp = grad.data_ptr<float>();
  const float* ep = ends.data_ptr<float>();
  const float* sp = starts.data_ptr<float>();
  const float* tp = tables.data_ptr<float>();
  float* gep = g_ends.data_ptr<float>();
  float* gsp = g_starts.data_ptr<float>();
  float* gtp = g_tables.data_ptr<float>();
  const int64_t offset = s.Lk - s.Lq;
  // One (batch, head) per task: a later key's count feeds another query's sum (and every query feeds
  // every key's), so the rows of one head are summed by one thread.
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const float* starts_bh = sp + bh * s.Lk;
      const float* ends_bh = ep + bh * s.Lq;
      float* g_starts_bh = gsp + bh * s.Lk;
      float* g_ends_bh = gep + bh * s.Lq;
      for (int64_t i = 0; i < s.Lq; ++i) {
        const int64_t row = bh * s.Lq + i;
        const float* T = tp + row * s.P;
        float* gT = gtp + row * s.P;
        const float* g = gp + row * s.Lk;
        const float c = ends_bh[i];
        const int64_t last = i + offset;
        float g_c = 0.0f;
        for (int64_t j = 0; j <= last; ++j) {
          const float d = count_gradient(c - starts_bh[j], g[j], T, gT, s.P);
          g_c += d;
          g_starts_bh[j] -= d;
        }
        g_ends_bh[i] += g_c;
        if (causal) continue;
        for (int64_t j = last + 1; j < s.Lk; ++j) {
          const float d = count_gradient(ends_bh[j] - starts_bh[i], g[j], T, gT, s.P);
          g_ends_bh[j] += d;
          g_starts_bh[i] -= d;
        }
      }
    }
  });
  return {g_ends, g_starts, g_tables};
}
