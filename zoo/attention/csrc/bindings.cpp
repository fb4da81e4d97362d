// The Python face of zoo's compiled CPU kernels (see zoo/attention/native.py).

#include <torch/extension.h>

#include <vector>

torch::Tensor softmax_one_lastdim(const torch::Tensor& x);
std::vector<torch::Tensor> micro_scan_forward(const torch::Tensor& x, const torch::Tensor& s,
                                              const torch::Tensor& S0, const torch::Tensor& z0);
std::vector<torch::Tensor> micro_scan_backward(const torch::Tensor& gd, const torch::Tensor& gS_last,
                                               const torch::Tensor& gz_last, const torch::Tensor& x,
                                               const torch::Tensor& s, const torch::Tensor& S0,
                                               const torch::Tensor& z0);
std::vector<torch::Tensor> elita_scan_forward(const torch::Tensor& l, const torch::Tensor& r,
                                              const torch::Tensor& v, const torch::Tensor& A0,
                                              const torch::Tensor& M0);
std::vector<torch::Tensor> elita_scan_backward(const torch::Tensor& gy, const torch::Tensor& gA_last,
                                               const torch::Tensor& gM_last, const torch::Tensor& l,
                                               const torch::Tensor& r, const torch::Tensor& v,
                                               const torch::Tensor& A0, const torch::Tensor& M0);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax_one_lastdim", &softmax_one_lastdim, "softmax_one along the last dimension");
  m.def("micro_scan_forward", &micro_scan_forward, "MicroAttention's causal running mean, forward");
  m.def("micro_scan_backward", &micro_scan_backward, "MicroAttention's causal running mean, backward");
  m.def("elita_scan_forward", &elita_scan_forward, "ELiTA's log-space running mean and gate, forward");
  m.def("elita_scan_backward", &elita_scan_backward, "ELiTA's log-space running mean and gate, backward");
}
