#ifndef MNEME_TOOLS_QUANT_BLAS_H_
#define MNEME_TOOLS_QUANT_BLAS_H_

// The CBLAS interface of OpenBLAS (@sys//:openblas, Debian's pthread build),
// which the quantization tools use for their matrix products. Their own
// threads call BLAS concurrently on small matrices, so OpenBLAS is told once
// to stay single-threaded inside each call (EnsureSingleThreadedBlas), which
// avoids oversubscribing the cores. The setting is process-wide.

#include <cblas.h>  // IWYU pragma: export

#include <string>

namespace mneme::quant {

// Sets OpenBLAS to one thread per call, once per process. Thread-safe.
void EnsureSingleThreadedBlas();

// The kernel family OpenBLAS chose for this CPU at load time, e.g.
// "SkylakeX", "Haswell", "Prescott".
std::string BlasCoreName();

// A hint when OpenBLAS runs its generic SSE3 kernels ("Prescott", chosen for
// CPUs its build does not recognize, e.g. newer Xeons in virtual machines)
// on a CPU with AVX2: setting OPENBLAS_CORETYPE makes the GPTQ products
// about 2x faster. Empty otherwise.
std::string BlasKernelHint();

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_BLAS_H_
