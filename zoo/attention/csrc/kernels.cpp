// The four kernels, built as one translation unit beside bindings.cpp. Each kernel file is mostly PyTorch's
// headers to the compiler: built one by one they took 13-14 s apiece at -O3 (54 s of CPU), as one unit 16 s;
// bindings.cpp (pybind11, 22 s) builds beside it, so a first build on 2 cores takes 21 s rather than 44 s.
// The files keep their helpers in anonymous namespaces under names of their own, which one unit requires.
#include "softmax_one.cpp"
#include "micro_scan.cpp"
#include "elita_scan.cpp"
#include "incontext_bias.cpp"
