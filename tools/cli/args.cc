#include "tools/cli/args.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace mneme::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::set<std::string>& value_flags,
                                 const std::set<std::string>& bool_flags) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argv.size(); ++i) args.positionals_.push_back(argv[i]);
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      args.positionals_.push_back(argv[i]);
      continue;
    }
    std::string name;
    std::optional<std::string> value;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
    } else {
      name = std::string(arg);
    }
    if (bool_flags.count(name) != 0) {
      if (value.has_value() && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value (or true/false)"));
      }
      if (!value.has_value()) value = "true";
    } else if (value_flags.count(name) != 0) {
      if (!value.has_value()) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value"));
        }
        value = argv[++i];
      }
    } else {
      std::vector<std::string> known;
      known.reserve(value_flags.size() + bool_flags.size());
      for (const std::string& f : value_flags) known.push_back("--" + f);
      for (const std::string& f : bool_flags) known.push_back("--" + f);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, " (known: ",
          known.empty() ? "none" : absl::StrJoin(known, " "), ")"));
    }
    if (!args.values_.emplace(name, *value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " given twice"));
    }
  }
  return args;
}

bool Args::Has(const std::string& name) const {
  return values_.count(name) != 0;
}

std::string Args::Get(const std::string& name,
                      const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<std::string> Args::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  }
  return it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback,
                                     int64_t min, int64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", it->second,
                                                   ": expected an integer in [",
                                                   min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback,
                                       double min, double max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double value = 0;
  if (!absl::SimpleAtod(it->second, &value) || !(value >= min) ||
      !(value <= max)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", it->second,
                                                   ": expected a number in [",
                                                   min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> Args::GetIntList(
    const std::string& name) const {
  ASSIGN_OR_RETURN(std::string text, Required(name));
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": '", part, "' is not an integer"));
    }
    values.push_back(value);
  }
  return values;
}

absl::StatusOr<std::string> Args::GetChoice(
    const std::string& name, const std::string& fallback,
    const std::vector<std::string>& choices) const {
  const std::string value = Get(name, fallback);
  for (const std::string& c : choices) {
    if (c == value) return value;
  }
  return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value,
                                                 ": expected one of ",
                                                 absl::StrJoin(choices, "|")));
}

}  // namespace mneme::cli
