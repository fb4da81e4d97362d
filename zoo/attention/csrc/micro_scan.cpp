// MicroAttention's causal running mean on the CPU: one pass forward, two backward.
//
// For every (batch, head) sequence, with tokens x_t (width D), scores s_t >= 0 and the
// carried sums S0 (width D) and z0:
//     S_t = S0 + sum_{j<=t} s_j x_j,   z_t = z0 + sum_{j<=t} s_j,
//     d_t = x_t - S_t / z_t            (S_t / z_t := S_t where z_t = 0, which is 0 there).
// The eager route makes about a dozen full-width passes for this (product, cumsum,
// division, difference, and flips in the cumsum's backward), and on long sequences its
// time goes to memory traffic. Here the forward reads x once and writes d once; the
// backward recomputes S_t in a forward sweep instead of keeping it, then gathers the
// gradients in a reverse sweep, so nothing full-width is saved between the two.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <ATen/Parallel.h>

#include "checks.h"

#include <vector>



namespace {

void check_micro_inputs(const char* kernel, const at::Tensor& x, const at::Tensor& s, const at::Tensor& S0,
                        const at::Tensor& z0, int64_t B, int64_t L, int64_t H, int64_t D) {
  zoo::check_tensor(kernel, "x", x, {B, L, H, D}, {at::kFloat});
  zoo::check_tensor(kernel, "s", s, {B, L, H}, {at::kFloat});
  zoo::check_tensor(kernel, "S0", S0, {B, H, D}, {at::kFloat});
  zoo::check_tensor(kernel, "z0", z0, {B, H}, {at::kFloat});
}

}  // namespace

// x (B, L, H, D), s (B, L, H), S0 (B, H, D), z0 (B, H) -> d (B, L, H, D), S_L (B, H, D), z_L (B, H)
std::vector<at::Tensor> micro_scan_forward(const at::Tensor& x, const at::Tensor& s,
                                           const at::Tensor& S0, const at::Tensor& z0) {
  const auto n = zoo::sizes_of("micro_scan_forward", "x", x, 4);
  const int64_t B = n[0], L = n[1], H = n[2], D = n[3];
  check_micro_inputs("micro_scan_forward", x, s, S0, z0, B, L, H, D);
  auto d = at::empty_like(x);
  auto S_last = S0.clone();
  auto z_last = z0.clone();
  const float* xp = x.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* dp = d.data_ptr<float>();
  float* Sp = S_last.data_ptr<float>();
  float* zp = z_last.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* S = Sp + bh * D;
      float z = zp[bh];
      for (int64_t t = 0; t < L; ++t) {
        const int64_t row = (b * L + t) * H + h;
        const float* xt = xp + row * D;
        float* dt = dp + row * D;
        const float st = sp[row];
        z += st;
        const float inv = z > 0.0f ? 1.0f / z : 1.0f;
        for (int64_t c = 0; c < D; ++c) {
          S[c] += st * xt[c];
          dt[c] = xt[c] - S[c] * inv;
        }
      }
      zp[bh] = z;
    }
  });
  return {d, S_last, z_last};
}

// Gradients of d, S_L, z_L -> gradients of x, s, S0, z0.
std::vector<at::Tensor> micro_scan_backward(const at::Tensor& gd, const at::Tensor& gS_last,
                                            const at::Tensor& gz_last, const at::Tensor& x,
                                            const at::Tensor& s, const at::Tensor& S0,
                                            const at::Tensor& z0) {
  const auto n = zoo::sizes_of("micro_scan_backward", "x", x, 4);
  const int64_t B = n[0], L = n[1], H = n[2], D = n[3];
  check_micro_inputs("micro_scan_backward", x, s, S0, z0, B, L, H, D);
  zoo::check_tensor("micro_scan_backward", "gd", gd, {B, L, H, D}, {at::kFloat});
  zoo::check_tensor("micro_scan_backward", "gS_last", gS_last, {B, H, D}, {at::kFloat});
  zoo::check_tensor("micro_scan_backward", "gz_last", gz_last, {B, H}, {at::kFloat});
  auto gx = at::empty_like(x);
  auto gs = at::empty_like(s);
  auto gS0 = gS_last.clone();
  auto gz0 = gz_last.clone();
  const float* xp = x.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* gp = gd.data_ptr<float>();
  float* gxp = gx.data_ptr<float>();
  float* gsp = gs.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(D), z(L), gz_local(L);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      // Forward sweep: z_t, and the part of z_t's gradient that d_t gives directly,
      // d(-S_t / z_t) / dz_t . g_t = (S_t . g_t) / z_t^2 (zero where z_t = 0: 1 is a constant there).
      std::copy(S0.data_ptr<float>() + bh * D, S0.data_ptr<float>() + (bh + 1) * D, S.begin());
      float zt = z0.data_ptr<float>()[bh];
      for (int64_t t = 0; t < L; ++t) {
        const int64_t row = (b * L + t) * H + h;
        const float* xt = xp + row * D;
        const float* gt = gp + row * D;
        const float st = sp[row];
        zt += st;
        float dot = 0.0f;
        for (int64_t c = 0; c < D; ++c) {
          S[c] += st * xt[c];
          dot += S[c] * gt[c];
        }
        z[t] = zt;
        gz_local[t] = zt > 0.0f ? dot / (zt * zt) : 0.0f;
      }
      // Reverse sweep: GS and Gz gather every later token's gradient of S_t and z_t.
      float* GS = gS0.data_ptr<float>() + bh * D;
      float Gz = gz0.data_ptr<float>()[bh];
      for (int64_t t = L - 1; t >= 0; --t) {
        const int64_t row = (b * L + t) * H + h;
        const float* xt = xp + row * D;
        const float* gt = gp + row * D;
        float* gxt = gxp + row * D;
        const float st = sp[row];
        const float inv = z[t] > 0.0f ? 1.0f / z[t] : 1.0f;
        Gz += gz_local[t];
        float dot = 0.0f;
        for (int64_t c = 0; c < D; ++c) {
          GS[c] -= gt[c] * inv;
          gxt[c] = gt[c] + st * GS[c];
          dot += GS[c] * xt[c];
        }
        gsp[row] = dot + Gz;
      }
      gz0.data_ptr<float>()[bh] = Gz;
    }
  });
  return {gx, gs, gS0, gz0};
}
