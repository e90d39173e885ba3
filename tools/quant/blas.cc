#include "tools/quant/blas.h"

#include <mutex>

namespace mneme::quant {

void EnsureSingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

std::string BlasKernelHint() {
#if defined(__x86_64__)
  const std::string core = BlasCoreName();
  const bool generic = core == "Prescott" || core == "Core2" ||
                       core == "Katmai" || core == "Coppermine" ||
                       core == "Northwood" || core == "Banias";
  if (generic && __builtin_cpu_supports("avx2")) {
    const char* type =
        __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
    return "OpenBLAS uses its generic '" + core +
           "' kernels on this CPU; export OPENBLAS_CORETYPE=" + type +
           " for faster GPTQ";
  }
#endif
  return std::string();
}

}  // namespace mneme::quant
