#ifndef MNEME_TOOLS_CLI_PERCENTILE_H_
#define MNEME_TOOLS_CLI_PERCENTILE_H_

#include <vector>

namespace mneme::cli {

// The nearest-rank p-th percentile (p in [0, 100]) of `values`; 0 for none.
double Percentile(std::vector<double> values, double p);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_PERCENTILE_H_
