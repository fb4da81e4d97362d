// InContextAttention's attention with its position bias computed inside the kernel: never an L x L tensor.
//
// For every (batch, head), with the gate sums c_i at the queries ("ends"), c_{j-1} at the keys ("starts") and
// each query's bias table T_i over P contextual positions (see incontext.py and csrc/incontext_bias.cpp):
//     s_ij = scale q_i . k_j + lerp(T_i[floor p], T_i[min(floor p + 1, P - 1)], p - floor p),
//     p_ij = clamp(c_i - c_{j-1}, 0, P - 1),   j <= i,
//     p_ij = clamp(c_j - c_{i-1}, 0, P - 1),   j > i (bidirectional; causal: -inf, no key after the query),
//     out_i = sum_j softmax_j(s_ij) v_j.
// Flash attention's blocking (as PyTorch's own CPU kernel, aten/src/ATen/native/cpu/FlashAttentionKernel.cpp):
// a block of queries against a block of keys at a time, q k^T and p v by BLAS, an online softmax, and the
// log-sum-exp of each row kept for the backward, which recomputes the block's logits (bias included) from the
// O(L) sums and tables. Memory is O(L): q, k, v, out, lse and the tables, never the (L x L) bias or weights.
//
// The bias: the counts grow with the distance from the query (the gates are >= 0), so most of a long row lies
// beyond the table's last entry, where the bias is T_i[P - 1] and its count has no gradient; a vector of keys all there
// takes that entry alone, without the two gathers (each lane is still tested: nothing assumes the order).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/csrc/utils/pybind.h>

#include "checks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using IVec = at::vec::Vectorized<int32_t>;

constexpr int64_t Q_BLOCK = 64;   // queries per block
constexpr int64_t K_BLOCK = 128;  // keys per block: the causal diagonal wastes about half a block per row block
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// The Fortran BLAS gemm that libtorch_cpu exports (MKL's, in PyTorch's wheels): at::native::cpublas::gemm, which
// PyTorch's own flash kernel calls, is not exported to extensions. Inside at::parallel_for MKL runs on the
// calling thread, as it does for PyTorch's kernel.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

// column-major C (m x n) = alpha op(A) op(B) + beta C
inline void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int m_ = static_cast<int>(m), n_ = static_cast<int>(n), k_ = static_cast<int>(k);
  const int lda_ = static_cast<int>(lda), ldb_ = static_cast<int>(ldb), ldc_ = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &m_, &n_, &k_, &alpha, A, &lda_, B, &ldb_, &beta, C, &ldc_);
}

// Row-major helpers over column-major BLAS. C (m x n, ldc) = alpha X Y^T + beta C, X (m x k), Y (n x k).
inline void mm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* X, int64_t ldx, const float* Y,
                  int64_t ldy, float beta, float* C, int64_t ldc) {
  gemm('T', 'N', n, m, k, alpha, Y, ldy, X, ldx, beta, C, ldc);
}
// C (m x n) = alpha X Y + beta C, X (m x k), Y (k x n).
inline void mm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* X, int64_t ldx, const float* Y,
                  int64_t ldy, float beta, float* C, int64_t ldc) {
  gemm('N', 'N', n, m, k, alpha, Y, ldy, X, ldx, beta, C, ldc);
}
// C (m x n) = alpha X^T Y + beta C, X (k x m), Y (k x n).
inline void mm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float* X, int64_t ldx, const float* Y,
                  int64_t ldy, float beta, float* C, int64_t ldc) {
  gemm('N', 'T', n, m, k, alpha, Y, ldy, X, ldx, beta, C, ldc);
}

struct Point {
  int64_t low, high;
  float weight;
};

inline Point locate(float count, int64_t P) {
  const float p = std::min(std::max(count, 0.0f), static_cast<float>(P - 1));
  const int64_t low = p > 0.0f ? static_cast<int64_t>(p) : 0;
  return {low, std::min(low + 1, P - 1), p - static_cast<float>(low)};
}

// torch.lerp's formula, as csrc/incontext_bias.cpp
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

inline Vec lerp(const Vec& a, const Vec& b, const Vec& w) {
  const Vec d = b - a;
  return Vec::blendv(b - d * (Vec(1.0f) - w), a + w * d, w < Vec(0.5f));
}

// The counts of a row's keys j < n: behind the query (and the query itself), c - x[j] with c the query's end and x
// the keys' starts; Later (bidirectional), keys after the query, x[j] - c with x the keys' ends and c the query's
// start.
template <bool Later>
inline float count_of(float c, float x) { return Later ? x - c : c - x; }
template <bool Later>
inline Vec count_of(const Vec& c, const Vec& x) { return Later ? x - c : c - x; }

// s[j] += interp(T, count_j) for j < n
template <bool Later>
inline void add_bias(float* s, int64_t n, float c, const float* x, const float* T, int64_t P) {
  const float last = static_cast<float>(P - 1);
  const Vec top(T[P - 1]);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    const Vec count = count_of<Later>(Vec(c), Vec::loadu(x + j));
    Vec bias;
    if ((count >= Vec(last)).zero_mask() == 0) {  // every lane beyond the table: its last entry
      bias = top;
    } else {
      const Vec p = at::vec::clamp(count, Vec(0.0f), Vec(last));
      // truncation, which is floor for p >= 0; a NaN count converts to INT_MIN, kept inside the table
      const IVec low = at::vec::maximum(at::vec::convert_to_int_of_same_size(p), IVec(0));
      const IVec high = at::vec::minimum(low + IVec(1), IVec(static_cast<int32_t>(P - 1)));
      bias = lerp(at::vec::gather<sizeof(float)>(T, low), at::vec::gather<sizeof(float)>(T, high), p - p.trunc());
    }
    (Vec::loadu(s + j) + bias).store(s + j);
  }
  for (; j < n; ++j) {
    const Point at = locate(count_of<Later>(c, x[j]), P);
    s[j] += lerp(T[at.low], T[at.high], at.weight);
  }
}

// The gradient g[j] of the bias at keys j < n into the table row gT, the keys' x (gx[j] -= d behind, += d later)
// and the query's c (returned: d summed, to add behind and subtract later), with d = g[j] times the slope between
// the two entries strictly inside the clamps, 0 on them (as torch.clamp's gradient; a padded token's own count is
// exactly 0).
template <bool Later>
inline float bias_gradient(const float* g, int64_t n, float c, const float* x, const float* T, float* gT, float* gx,
                           int64_t P) {
  const float last = static_cast<float>(P - 1);
  float g_c = 0.0f;
  float g_top = 0.0f;
  Vec g_c_vec(0.0f);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    const Vec count = count_of<Later>(Vec(c), Vec::loadu(x + j));
    if ((count >= Vec(last)).zero_mask() == 0) {
      g_top += at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, Vec::loadu(g + j));
      continue;
    }
    // the counts' gradients by vector; the table's by lane (lanes may share an entry)
    const Vec p = at::vec::clamp(count, Vec(0.0f), Vec(last));
    const IVec low = at::vec::maximum(at::vec::convert_to_int_of_same_size(p), IVec(0));
    const IVec high = at::vec::minimum(low + IVec(1), IVec(static_cast<int32_t>(P - 1)));
    const Vec w = p - p.trunc();
    const Vec gj = Vec::loadu(g + j);
    const Vec slope = at::vec::gather<sizeof(float)>(T, high) - at::vec::gather<sizeof(float)>(T, low);
    const Vec d = gj * slope & (count > Vec(0.0f)) & (count < Vec(last));  // 0 on the clamps
    g_c_vec = g_c_vec + d;
    (Later ? Vec::loadu(gx + j) + d : Vec::loadu(gx + j) - d).store(gx + j);
    int32_t lows[Vec::size()], highs[Vec::size()];
    float to_low[Vec::size()], to_high[Vec::size()];
    low.store(lows);
    high.store(highs);
    (gj - gj * w).store(to_low);
    (gj * w).store(to_high);
    for (int l = 0; l < Vec::size(); ++l) {
      gT[lows[l]] += to_low[l];
      gT[highs[l]] += to_high[l];
    }
  }
  g_c += at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, g_c_vec);
  for (; j < n; ++j) {
    const float cnt = count_of<Later>(c, x[j]);
    const Point at = locate(cnt, P);
    gT[at.low] += g[j] * (1.0f - at.weight);
    gT[at.high] += g[j] * at.weight;
    const float d = cnt > 0.0f && cnt < last ? g[j] * (T[at.high] - T[at.low]) : 0.0f;
    g_c += d;
    gx[j] += Later ? d : -d;
  }
  gT[P - 1] += g_top;
  return g_c;
}

// A float32 CPU tensor of exactly `sizes` whose rows are contiguous (last stride 1), with any other strides: the
// layer's q, k, v and tables are views of its projections, (B, L, H, .) transposed to (B, H, L, .), and copying
// them would cost a pass each way.
inline void check_rows(const char* kernel, const char* name, const at::Tensor& t,
                       std::initializer_list<int64_t> sizes) {
  TORCH_CHECK_VALUE(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat, kernel, ": ", name,
                    " must be a float32 CPU tensor");
  const c10::IntArrayRef expected(sizes);
  TORCH_CHECK_VALUE(t.sizes().equals(expected), kernel, ": ", name, " must have shape ", expected, ", got ",
                    t.sizes());
  TORCH_CHECK_VALUE(t.stride(3) == 1 || t.size(3) == 1, kernel, ": ", name, "'s rows must be contiguous (strides ",
                    t.strides(), ")");
}

// (B, H, L, n) rows of a strided tensor: the (batch, head) bh's first row and the step between rows.
template <typename T>
struct Rows {
  T* data;
  int64_t batch, head, row, H;
  Rows(const at::Tensor& t)
      : data(t.data_ptr<float>()), batch(t.stride(0)), head(t.stride(1)), row(t.stride(2)), H(t.size(1)) {}
  T* at(int64_t bh) const { return data + (bh / H) * batch + (bh % H) * head; }
};

struct Shape {
  int64_t B, H, L, D, P;
  bool causal;
  int64_t keys(int64_t i) const { return causal ? i + 1 : L; }  // the keys query i sees: 0 .. keys(i) - 1
};

Shape check_inputs(const char* kernel, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& ends, const at::Tensor& starts, const at::Tensor& tables, bool causal) {
  const auto n = zoo::sizes_of(kernel, "q", q, 4);
  const Shape s{n[0], n[1], n[2], n[3], zoo::sizes_of(kernel, "tables", tables, 4)[3], causal};
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}, {"v", v}}) {
    check_rows(kernel, name, t, {s.B, s.H, s.L, s.D});
  }
  zoo::check_tensor(kernel, "ends", ends, {s.B, s.H, s.L}, {at::kFloat});
  zoo::check_tensor(kernel, "starts", starts, {s.B, s.H, s.L}, {at::kFloat});
  check_rows(kernel, "tables", tables, {s.B, s.H, s.L, s.P});
  TORCH_CHECK_VALUE(s.P >= 1, kernel, ": tables must have at least one position, got ", s.P);
  return s;
}

// logits of queries i0..i0+mq against keys j0..j0+nk into S (ld K_BLOCK), bias added; causal: later keys -inf
// (row r's valid keys are min(nk, i0 + r + 1 - j0)); bidirectional: the later keys' counts run from the query
inline void logits(const float* q, int64_t lq, const float* k, int64_t lk, const float* ends, const float* starts,
                   const float* tables, int64_t lt, int64_t i0, int64_t mq, int64_t j0, int64_t nk, const Shape& s,
                   float scale, float* S) {
  mm_nt(mq, nk, s.D, scale, q + i0 * lq, lq, k + j0 * lk, lk, 0.0f, S, K_BLOCK);
  for (int64_t r = 0; r < mq; ++r) {
    const int64_t i = i0 + r;
    const int64_t behind = std::clamp<int64_t>(i + 1 - j0, 0, nk);
    float* row = S + r * K_BLOCK;
    add_bias<false>(row, behind, ends[i], starts + j0, tables + i * lt, s.P);
    if (s.causal) {
      std::fill(row + behind, row + nk, NEG_INF);
    } else {
      add_bias<true>(row + behind, nk - behind, starts[i], ends + j0 + behind, tables + i * lt, s.P);
    }
  }
}

}  // namespace

// q, k, v (B, H, L, D), ends, starts (B, H, L), tables (B, H, L, P), all float32 -> out (B, H, L, D), lse (B, H, L)
std::vector<at::Tensor> incontext_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const at::Tensor& ends, const at::Tensor& starts,
                                                    const at::Tensor& tables, double scale_, bool causal) {
  const Shape s = check_inputs("incontext_attention_forward", q, k, v, ends, starts, tables, causal);
  auto out = at::empty({s.B, s.H, s.L, s.D}, q.options());
  auto lse = at::empty({s.B, s.H, s.L}, q.options());
  const float scale = static_cast<float>(scale_);
  const int64_t blocks = (s.L + Q_BLOCK - 1) / Q_BLOCK;
  const Rows<const float> Q(q), K(k), V(v), T(tables);
  const float *ep = ends.data_ptr<float>(), *sp = starts.data_ptr<float>();
  float *op = out.data_ptr<float>(), *lp = lse.data_ptr<float>();
  at::parallel_for(0, s.B * s.H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(Q_BLOCK * K_BLOCK), acc(Q_BLOCK * s.D), m(Q_BLOCK), l(Q_BLOCK);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, i0 = (task % blocks) * Q_BLOCK, mq = std::min(Q_BLOCK, s.L - i0);
      const float *q_bh = Q.at(bh), *k_bh = K.at(bh), *v_bh = V.at(bh), *t_bh = T.at(bh);
      const float *e_bh = ep + bh * s.L, *s_bh = sp + bh * s.L;
      std::fill(m.begin(), m.end(), NEG_INF);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t seen = s.keys(i0 + mq - 1);
      for (int64_t j0 = 0; j0 < seen; j0 += K_BLOCK) {
        const int64_t nk = std::min(K_BLOCK, seen - j0);
        logits(q_bh, Q.row, k_bh, K.row, e_bh, s_bh, t_bh, T.row, i0, mq, j0, nk, s, scale, S.data());
        for (int64_t r = 0; r < mq; ++r) {
          float* row = S.data() + r * K_BLOCK;
          const int64_t valid = std::clamp<int64_t>(s.keys(i0 + r) - j0, 0, nk);
          if (valid == 0) {
            std::fill(row, row + nk, 0.0f);
            continue;
          }
          const float top = std::max(m[r], at::vec::reduce_all<float>(
              [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, row, valid));
          float sum = 0.0f;
          at::vec::map([top](Vec x) { return (x - Vec(top)).exp_u20(); }, row, row, valid);
          sum = at::vec::reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, row, valid);
          std::fill(row + valid, row + nk, 0.0f);
          const float rescale = std::exp(m[r] - top);  // exp(-inf) = 0 on the first block
          l[r] = l[r] * rescale + sum;
          m[r] = top;
          if (rescale != 1.0f) {
            float* a = acc.data() + r * s.D;
            at::vec::map([rescale](Vec x) { return x * Vec(rescale); }, a, a, s.D);
          }
        }
        mm_nn(mq, s.D, nk, 1.0f, S.data(), K_BLOCK, v_bh + j0 * V.row, V.row, 1.0f, acc.data(), s.D);
      }
      for (int64_t r = 0; r < mq; ++r) {
        const float inv = 1.0f / l[r];
        float* o = op + (bh * s.L + i0 + r) * s.D;
        at::vec::map([inv](Vec x) { return x * Vec(inv); }, o, acc.data() + r * s.D, s.D);
        lp[bh * s.L + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  });
  return {out, lse};
}

// -> the gradients of q, k, v, ends, starts and tables
std::vector<at::Tensor> incontext_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& out,
                                                     const at::Tensor& lse, const at::Tensor& ends,
                                                     const at::Tensor& starts, const at::Tensor& tables,
                                                     double scale_, bool causal) {
  const char* kernel = "incontext_attention_backward";
  const Shape s = check_inputs(kernel, q, k, v, ends, starts, tables, causal);
  zoo::check_tensor(kernel, "lse", lse, {s.B, s.H, s.L}, {at::kFloat});
  check_rows(kernel, "grad", grad, {s.B, s.H, s.L, s.D});
  check_rows(kernel, "out", out, {s.B, s.H, s.L, s.D});
  const auto options = q.options();
  auto gq = at::zeros(q.sizes(), options), gk = at::zeros(k.sizes(), options), gv = at::zeros(v.sizes(), options);
  // the tables' gradient in the tables' own layout (as torch.empty_like keeps it), so that the projection's
  // backward reads it without a copy
  auto g_ends = at::zeros_like(ends), g_starts = at::zeros_like(starts), g_tables = at::zeros_like(tables);
  const float scale = static_cast<float>(scale_);
  const Rows<const float> Q(q), K(k), V(v), T(tables), GO(grad), O(out);
  const Rows<float> GT(g_tables);
  const float *lp = lse.data_ptr<float>(), *ep = ends.data_ptr<float>(), *sp = starts.data_ptr<float>();
  float *gqp = gq.data_ptr<float>(), *gkp = gk.data_ptr<float>(), *gvp = gv.data_ptr<float>();
  float *gep = g_ends.data_ptr<float>(), *gsp = g_starts.data_ptr<float>();
  // One (batch, head) per task: every query block adds to every earlier key's gradients.
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(Q_BLOCK * K_BLOCK), dP(Q_BLOCK * K_BLOCK), delta(s.L);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t at_qkv = bh * s.L * s.D, at_row = bh * s.L;
      const float *q_bh = Q.at(bh), *k_bh = K.at(bh), *v_bh = V.at(bh), *t_bh = T.at(bh);
      const float *go_bh = GO.at(bh), *o_bh = O.at(bh), *l_bh = lp + at_row;
      const float *e_bh = ep + at_row, *s_bh = sp + at_row;
      float *gq_bh = gqp + at_qkv, *gk_bh = gkp + at_qkv, *gv_bh = gvp + at_qkv, *gt_bh = GT.at(bh);
      float *ge_bh = gep + at_row, *gs_bh = gsp + at_row;
      for (int64_t i = 0; i < s.L; ++i) {  // delta_i = dO_i . O_i
        delta[i] = at::vec::map2_reduce_all<float>([](Vec a, Vec b) { return a * b; },
                                                   [](Vec a, Vec b) { return a + b; }, go_bh + i * GO.row,
                                                   o_bh + i * O.row, s.D);
      }
      for (int64_t i0 = 0; i0 < s.L; i0 += Q_BLOCK) {
        const int64_t mq = std::min(Q_BLOCK, s.L - i0);
        const int64_t seen = s.keys(i0 + mq - 1);
        for (int64_t j0 = 0; j0 < seen; j0 += K_BLOCK) {
          const int64_t nk = std::min(K_BLOCK, seen - j0);
          logits(q_bh, Q.row, k_bh, K.row, e_bh, s_bh, t_bh, T.row, i0, mq, j0, nk, s, scale, S.data());
          for (int64_t r = 0; r < mq; ++r) {  // P = exp(s - lse), 0 at the later keys
            float* row = S.data() + r * K_BLOCK;
            const float top = l_bh[i0 + r];
            at::vec::map([top](Vec x) { return (x - Vec(top)).exp_u20(); }, row, row, nk);
            const int64_t valid = std::clamp<int64_t>(s.keys(i0 + r) - j0, 0, nk);
            std::fill(row + valid, row + nk, 0.0f);
          }
          // dV += P^T dO;  dP = dO V^T
          mm_tn(nk, s.D, mq, 1.0f, S.data(), K_BLOCK, go_bh + i0 * GO.row, GO.row, 1.0f, gv_bh + j0 * s.D, s.D);
          mm_nt(mq, nk, s.D, 1.0f, go_bh + i0 * GO.row, GO.row, v_bh + j0 * V.row, V.row, 0.0f, dP.data(), K_BLOCK);
          for (int64_t r = 0; r < mq; ++r) {  // dS = P (dP - delta), the bias's gradient; into dP
            const int64_t i = i0 + r;
            const float d = delta[i];
            float* ds = dP.data() + r * K_BLOCK;
            at::vec::map2([d](Vec p, Vec dp) { return p * (dp - Vec(d)); }, ds, S.data() + r * K_BLOCK, ds, nk);
            const int64_t behind = std::clamp<int64_t>(i + 1 - j0, 0, nk);
            ge_bh[i] += bias_gradient<false>(ds, behind, e_bh[i], s_bh + j0, t_bh + i * T.row, gt_bh + i * GT.row,
                                      gs_bh + j0, s.P);
            if (!s.causal) {
              gs_bh[i] -= bias_gradient<true>(ds + behind, nk - behind, s_bh[i], e_bh + j0 + behind,
                                              t_bh + i * T.row, gt_bh + i * GT.row, ge_bh + j0 + behind, s.P);
            }
          }
          // dQ += scale dS K;  dK += scale dS^T Q
          mm_nn(mq, s.D, nk, scale, dP.data(), K_BLOCK, k_bh + j0 * K.row, K.row, 1.0f, gq_bh + i0 * s.D, s.D);
          mm_tn(nk, s.D, mq, scale, dP.data(), K_BLOCK, q_bh + i0 * Q.row, Q.row, 1.0f, gk_bh + j0 * s.D, s.D);
        }
      }
    }
  });
  return {gq, gk, gv, g_ends, g_starts, g_tables};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("incontext_attention_forward", &incontext_attention_forward,
        "InContextAttention's causal attention with the bias computed in the kernel, forward");
  m.def("incontext_attention_backward", &incontext_attention_backward,
        "InContextAttention's causal attention with the bias computed in the kernel, backward");
}
