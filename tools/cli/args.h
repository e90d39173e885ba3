#ifndef MNEME_TOOLS_CLI_ARGS_H_
#define MNEME_TOOLS_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::cli {

// The arguments of one `mneme` subcommand: `--name=value`, `--name value`,
// bare `--flag` (value "true") and positionals. Each subcommand declares the
// flags it knows; anything else is an error naming it. Not thread-safe.
class Args {
 public:
  // Parses `argv` (after the subcommand words). `value_flags` take a value,
  // `bool_flags` do not. InvalidArgument for an unknown flag, a missing
  // value, or a flag given twice.
  static absl::StatusOr<Args> Parse(
      const std::vector<std::string>& argv,
      const std::set<std::string>& value_flags,
      const std::set<std::string>& bool_flags = {});

  bool Has(const std::string& name) const;
  // The value of `name`, or `fallback` when absent.
  std::string Get(const std::string& name, const std::string& fallback) const;
  // The value of a required flag; InvalidArgument naming it when absent.
  absl::StatusOr<std::string> Required(const std::string& name) const;
  // Integer value in [min, max]; InvalidArgument naming the flag otherwise.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback,
                                 int64_t min, int64_t max) const;
  // Finite number in [min, max]; InvalidArgument naming the flag otherwise.
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback,
                                   double min, double max) const;
  // Comma-separated int64 list (e.g. --ids=1,2,3); InvalidArgument naming
  // the flag and the bad element.
  absl::StatusOr<std::vector<int64_t>> GetIntList(
      const std::string& name) const;
  // One of `choices`; InvalidArgument listing them otherwise.
  absl::StatusOr<std::string> GetChoice(
      const std::string& name, const std::string& fallback,
      const std::vector<std::string>& choices) const;

  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positionals_;
};

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_ARGS_H_
