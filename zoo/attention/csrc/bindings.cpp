// The Python face of zoo's compiled CPU kernels (see zoo/attention/native.py).

// pybind11 and the tensor casters only, and ATen alone in the kernels: <torch/extension.h> pulls in the whole
// C++ frontend, which made the first build about three times longer.
#include <torch/csrc/utils/pybind.h>

#include <vector>

at::Tensor softmax_one_lastdim(const at::Tensor& x);
std::vector<at::Tensor> micro_scan_forward(const at::Tensor& x, const at::Tensor& s,
                                           const at::Tensor& S0, const at::Tensor& z0);
std::vector<at::Tensor> micro_scan_backward(const at::Tensor& gd, const at::Tensor& gS_last,
                                            const at::Tensor& gz_last, const at::Tensor& x,
                                            const at::Tensor& s, const at::Tensor& S0,
                                            const at::Tensor& z0);
std::vector<at::Tensor> elita_scan_forward(const at::Tensor& l, const at::Tensor& r,
                                           const at::Tensor& v, const at::Tensor& A0,
                                           const at::Tensor& M0);
std::vector<at::Tensor> elita_scan_backward(const at::Tensor& gy, const at::Tensor& gA_last,
                                            const at::Tensor& gM_last, const at::Tensor& l,
                                            const at::Tensor& r, const at::Tensor& v,
                                            const at::Tensor& A0, const at::Tensor& M0);
at::Tensor incontext_bias_forward(const at::Tensor& ends, const at::Tensor& starts, const at::Tensor& tables,
                                  bool causal);
std::vector<at::Tensor> incontext_bias_backward(const at::Tensor& grad, const at::Tensor& ends,
                                                const at::Tensor& starts, const at::Tensor& tables, bool causal);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax_one_lastdim", &softmax_one_lastdim, "softmax_one along the last dimension");
  m.def("micro_scan_forward", &micro_scan_forward, "MicroAttention's causal running mean, forward");
  m.def("micro_scan_backward", &micro_scan_backward, "MicroAttention's causal running mean, backward");
  m.def("elita_scan_forward", &elita_scan_forward, "ELiTA's log-space running mean and gate, forward");
  m.def("elita_scan_backward", &elita_scan_backward, "ELiTA's log-space running mean and gate, backward");
  m.def("incontext_bias_forward", &incontext_bias_forward, "InContextAttention's position bias, forward");
  m.def("incontext_bias_backward", &incontext_bias_backward, "InContextAttention's position bias, backward");
}
