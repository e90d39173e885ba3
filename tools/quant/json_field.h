#ifndef MNEME_TOOLS_QUANT_JSON_FIELD_H_
#define MNEME_TOOLS_QUANT_JSON_FIELD_H_

// Exception-free JSON access for the tools: nlohmann's value() and get<T>()
// throw on a type mismatch and dump() on invalid UTF-8; these do not.

#include <cstdint>
#include <string>
#include <type_traits>

#include "nlohmann/json.hpp"

namespace mneme::quant {

// obj[key] as T when `obj` is an object holding `key` with a value of T's
// kind (integer for integral T, any number for floating T, boolean, string);
// `fallback` otherwise.
template <typename T, typename Json>
T JsonField(const Json& obj, const std::string& key, T fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : fallback;
  } else if constexpr (std::is_integral_v<T>) {
    return it->is_number_integer() ? it->template get<T>() : fallback;
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? it->template get<T>() : fallback;
  } else {
    return it->is_string() ? it->template get<std::string>() : fallback;
  }
}

// `json` as 2-space indented text with a trailing newline; invalid UTF-8 in
// strings is replaced rather than thrown on.
template <typename Json>
std::string JsonText(const Json& json) {
  return json.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_JSON_FIELD_H_
