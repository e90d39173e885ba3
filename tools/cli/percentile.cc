#include "tools/cli/percentile.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace mneme::cli {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::max(1.0, std::ceil(p / 100.0 * values.size()));
  const size_t index = std::min(values.size(), static_cast<size_t>(rank)) - 1;
  return values[index];
}

}  // namespace mneme::cli
