// softmax_one along the last dimension on the CPU: y_i = exp(x_i) / (1 + sum_j exp(x_j)).
//
// The eager route (torch.softmax, then a rescale) reads and writes every element once
// more than torch.softmax does. This kernel makes the same three passes over a row as
// PyTorch's own softmax (max; exp and sum; scale) with the same vectorized exp, so the
// extra "1" costs nothing.
//
// Stability: with m = max(0, max_j x_j),
//     y_i = exp(x_i - m) / (exp(-m) + sum_j exp(x_j - m)).
// Every exponent is <= 0, so nothing overflows, and the denominator is >= 1 (the term
// at the maximum, or exp(-m) = 1 when m = 0), so a row of -inf gives zeros, not NaN.
// Half-precision rows are widened to float for the whole computation.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// x and y may be the same buffer.
void softmax_one_row(const float* x, float* y, int64_t n) {
  const float m = std::max(
      0.0f, at::vec::reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, x, n));
  const Vec vm(m);
  Vec vsum(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec e = (Vec::loadu(x + i) - vm).exp();
    e.store(y + i);
    vsum = vsum + e;
  }
  if (i < n) {  // the tail, masked to zero beyond n
    const Vec e = (Vec::loadu(x + i, n - i) - vm).exp();
    e.store(y + i, n - i);
    vsum = vsum + Vec::set(Vec(0.0f), e, n - i);
  }
  const float sum = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, vsum);
  const Vec scale(1.0f / (std::exp(-m) + sum));
  at::vec::map([scale](Vec v) { return v * scale; }, y, y, n);
}

}  // namespace

at::Tensor softmax_one_lastdim(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1, "softmax_one_lastdim: x must have at least one dimension");
  TORCH_CHECK_VALUE(x.device().is_cpu(), "softmax_one_lastdim: x must be a CPU tensor, got ", x.device());
  const auto type = x.scalar_type();
  TORCH_CHECK_VALUE(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
                    "softmax_one_lastdim: x must be Float or BFloat16 or Half, got ", type);
  const auto input = x.contiguous();
  auto out = at::empty_like(input);
  const int64_t n = input.size(-1);
  const int64_t rows = n == 0 ? 0 : input.numel() / n;
  // As in PyTorch's softmax: give each task about 32k element-operations.
  const int64_t grain = std::max<int64_t>(1, 32768 / (16 * std::max<int64_t>(n, 1)));

  if (input.scalar_type() == at::kFloat) {
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) softmax_one_row(src + r * n, dst + r * n, n);
    });
    return out;
  }
  AT_DISPATCH_REDUCED_FLOATING_TYPES(input.scalar_type(), "softmax_one_lastdim", [&] {
    const scalar_t* src = input.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> row(n);
      for (int64_t r = begin; r < end; ++r) {
        at::vec::convert(src + r * n, row.data(), n);
        softmax_one_row(row.data(), row.data(), n);
        at::vec::convert(row.data(), dst + r * n, n);
      }
    });
  });
  return out;
}
