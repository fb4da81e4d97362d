// ELiTA's Attention2 mix on the CPU (zoo/attention/elita.py): one pass forward, two backward.
//
// For every (batch, head) sequence, with history logits l_t, gate logits r_t, values v_t
// (width D) and the carried log-normalizer A_0 and running mean M_0:
//     A_t = logaddexp(A_{t-1}, l_t)                 (log sum_{j<=t} e^{l_j}, with A_0's mass)
//     M_t = a_t M_{t-1} + b_t v_t,  a_t = e^{A_{t-1} - A_t},  b_t = e^{l_t - A_t}  (a_t + b_t = 1)
//     y_t = M_t + g_t (v_t - M_t),  g_t = sigmoid(r_t - A_t)
// which is the chunked log-space form of elita.py's eager route, written as the
// recurrence it is: every exponent is <= 0, so nothing overflows. The eager route builds
// a 64x64 weight matrix per chunk and per head and makes dozens of passes over those and
// the values, forward and backward; here the forward reads l, r, v once and writes y
// once. The backward recomputes the weights and M_t in a forward sweep (into a scratch
// of one block), then gathers the gradients in a reverse sweep.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "checks.h"

namespace {

void check_elita_inputs(const char* kernel, const at::Tensor& l, const at::Tensor& r, const at::Tensor& v,
                        const at::Tensor& A0, const at::Tensor& M0, int64_t B, int64_t L, int64_t H, int64_t D) {
  zoo::check_tensor(kernel, "l", l, {B, L, H}, {at::kFloat});
  zoo::check_tensor(kernel, "r", r, {B, L, H}, {at::kFloat});
  zoo::check_tensor(kernel, "v", v, {B, L, H, D}, {at::kFloat, at::kBFloat16, at::kHalf});
  zoo::check_tensor(kernel, "A0", A0, {B, H}, {at::kFloat});
  zoo::check_tensor(kernel, "M0", M0, {B, H, D}, {at::kFloat});
}

// A_t = logaddexp(A, l) and the weights a = e^{A - A_t}, b = e^{l - A_t} of the old mean and
// the new token, from one exp and one log1p: with e = e^{-|A - l|} <= 1 the larger side
// gets 1 / (1 + e) and the smaller e / (1 + e), each without cancellation.
struct Merge {
  float A, a, b;
};

inline Merge merge(float A, float l) {
  const float e = std::exp(-std::fabs(A - l));
  const float big = 1.0f / (1.0f + e), small = e * big;
  return A >= l ? Merge{A + std::log1p(e), big, small} : Merge{l + std::log1p(e), small, big};
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

// l, r (B, L, H), v (B, L, H, D), A0 (B, H), M0 (B, H, D) -> y (B, L, H, D), A_L (B, H), M_L (B, H, D).
// Everything is float32 but v, which may be bf16 or fp16 (as a projection under autocast
// gives it): it is widened as it is read, so no float32 copy of it is made or kept.
std::vector<at::Tensor> elita_scan_forward(const at::Tensor& l, const at::Tensor& r,
                                           const at::Tensor& v, const at::Tensor& A0,
                                           const at::Tensor& M0) {
  const auto n = zoo::sizes_of("elita_scan_forward", "v", v, 4);
  const int64_t B = n[0], L = n[1], H = n[2], D = n[3];
  check_elita_inputs("elita_scan_forward", l, r, v, A0, M0, B, L, H, D);
  auto y = at::empty(v.sizes(), v.options().dtype(at::kFloat));
  auto A_last = A0.clone();
  auto M_last = M0.clone();
  const float* lp = l.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* Ap = A_last.data_ptr<float>();
  float* Mp = M_last.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, v.scalar_type(), "elita_scan_forward", [&] {
    const scalar_t* vp = v.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        float* M = Mp + bh * D;
        float A = Ap[bh];
        for (int64_t t = 0; t < L; ++t) {
          const int64_t row = (b * L + t) * H + h;
          const Merge m = merge(A, lp[row]);
          const float g = sigmoid(rp[row] - m.A);
          const scalar_t* vt = vp + row * D;
          float* yt = yp + row * D;
          for (int64_t c = 0; c < D; ++c) {
            const float vc = vt[c];
            M[c] = m.a * M[c] + m.b * vc;
            yt[c] = M[c] + g * (vc - M[c]);
          }
          A = m.A;
        }
        Ap[bh] = A;
      }
    });
  });
  return {y, A_last, M_last};
}

// Gradients of y, A_L, M_L -> gradients of l, r, v, A0, M0.
std::vector<at::Tensor> elita_scan_backward(const at::Tensor& gy, const at::Tensor& gA_last,
                                            const at::Tensor& gM_last, const at::Tensor& l,
                                            const at::Tensor& r, const at::Tensor& v,
                                            const at::Tensor& A0, const at::Tensor& M0) {
  const auto n = zoo::sizes_of("elita_scan_backward", "v", v, 4);
  const int64_t B = n[0], L = n[1], H = n[2], D = n[3];
  check_elita_inputs("elita_scan_backward", l, r, v, A0, M0, B, L, H, D);
  zoo::check_tensor("elita_scan_backward", "gy", gy, {B, L, H, D}, {at::kFloat});
  zoo::check_tensor("elita_scan_backward", "gA_last", gA_last, {B, H}, {at::kFloat});
  zoo::check_tensor("elita_scan_backward", "gM_last", gM_last, {B, H, D}, {at::kFloat});
  auto gl = at::empty_like(l);
  auto gr = at::empty_like(r);
  auto gv = at::empty_like(v);
  auto gA0 = gA_last.clone();
  auto gM0 = gM_last.clone();
  const float* lp = l.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  const float* gyp = gy.data_ptr<float>();
  float* glp = gl.data_ptr<float>();
  float* grp = gr.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, v.scalar_type(), "elita_scan_backward", [&] {
    const scalar_t* vp = v.data_ptr<scalar_t>();
    scalar_t* gvp = gv.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> keep(L), take(L), gate(L), M(L * D);  // a_t, b_t, g_t and M_t of one sequence, recomputed
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        const float* M_start = M0.data_ptr<float>() + bh * D;
        float A = A0.data_ptr<float>()[bh];
        const float* M_prev = M_start;
        for (int64_t t = 0; t < L; ++t) {
          const int64_t row = (b * L + t) * H + h;
          const Merge m = merge(A, lp[row]);
          keep[t] = m.a, take[t] = m.b, gate[t] = sigmoid(rp[row] - m.A);
          const scalar_t* vt = vp + row * D;
          float* Mt = M.data() + t * D;
          for (int64_t c = 0; c < D; ++c) Mt[c] = m.a * M_prev[c] + m.b * static_cast<float>(vt[c]);
          A = m.A;
          M_prev = Mt;
        }
        // Reverse sweep. GM and GA hold dL/dM_t and dL/dA_t; each step adds what y_t, b_t
        // and g_t pass to them, then hands on a_t times each to step t - 1.
        float* GM = gM0.data_ptr<float>() + bh * D;
        float GA = gA0.data_ptr<float>()[bh];
        for (int64_t t = L - 1; t >= 0; --t) {
          const int64_t row = (b * L + t) * H + h;
          const float* Mt = M.data() + t * D;
          const float* M_before = t > 0 ? M.data() + (t - 1) * D : M_start;
          const float at = keep[t], bt = take[t], gt = gate[t];
          const scalar_t* vt = vp + row * D;
          const float* gyt = gyp + row * D;
          scalar_t* gvt = gvp + row * D;
          float q = 0.0f;  // dL/dg_t = (v_t - M_t) . gy_t
          for (int64_t c = 0; c < D; ++c) q += (static_cast<float>(vt[c]) - Mt[c]) * gyt[c];
          const float gg = q * gt * (1.0f - gt);  // dL/d(r_t - A_t)
          grp[row] = gg;
          float gb = 0.0f;  // dL/db_t = GM . (v_t - M_{t-1}), with GM now whole at t
          for (int64_t c = 0; c < D; ++c) {
            GM[c] += (1.0f - gt) * gyt[c];
            gvt[c] = static_cast<scalar_t>(gt * gyt[c] + bt * GM[c]);
            gb += GM[c] * (static_cast<float>(vt[c]) - M_before[c]);
            GM[c] *= at;
          }
          GA -= gg + gb * bt;  // dL/dA_t: b_t and g_t both fall as A_t rises
          glp[row] = (gb + GA) * bt;  // through b_t directly and through A_t = logaddexp(A_{t-1}, l_t)
          GA *= at;
        }
        gA0.data_ptr<float>()[bh] = GA;
      }
    });
  });
  return {gl, gr, gv, gA0, gM0};
}
