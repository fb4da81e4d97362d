// Argument checks shared by zoo's CPU kernels: every tensor a kernel reads or writes is
// checked against the others before any memory is touched, and a mismatch is a Python
// ValueError (TORCH_CHECK_VALUE) that names the tensor, what was expected and what came.

#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>

namespace zoo {

// t must be a contiguous CPU tensor of exactly `sizes`, with a dtype allowed by `dtypes`.
// Runs on every call (decoding calls once a token), so nothing is built unless a check fails.
inline void check_tensor(const char* kernel, const char* name, const at::Tensor& t,
                         std::initializer_list<int64_t> sizes, std::initializer_list<at::ScalarType> dtypes) {
  TORCH_CHECK_VALUE(t.defined(), kernel, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.device().is_cpu(), kernel, ": ", name, " must be a CPU tensor, got ", t.device());
  bool dtype_ok = false;
  for (auto d : dtypes) dtype_ok = dtype_ok || t.scalar_type() == d;
  if (!dtype_ok) {
    std::string allowed;
    for (auto d : dtypes) allowed += (allowed.empty() ? "" : " or ") + std::string(c10::toString(d));
    TORCH_CHECK_VALUE(false, kernel, ": ", name, " must be ", allowed, ", got ", t.scalar_type());
  }
  const c10::IntArrayRef expected(sizes);
  TORCH_CHECK_VALUE(t.sizes().equals(expected), kernel, ": ", name, " must have shape ", expected, ", got ",
                    t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), kernel, ": ", name, " must be contiguous (strides ", t.strides(), ")");
}

// Sizes of a tensor of `dims` dimensions, for the tensor that fixes them (B, L, ...).
inline c10::IntArrayRef sizes_of(const char* kernel, const char* name, const at::Tensor& t, int64_t dims) {
  TORCH_CHECK_VALUE(t.defined() && t.dim() == dims, kernel, ": ", name, " must have ", dims, " dimensions, got ",
                    t.defined() ? t.sizes() : c10::IntArrayRef{});
  return t.sizes();
}

}  // namespace zoo
