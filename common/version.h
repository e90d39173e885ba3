#ifndef MNEME_COMMON_VERSION_H_
#define MNEME_COMMON_VERSION_H_

namespace mneme {

// The release of the daemons and tools (semantic versioning), reported by
// the HTTP front's /version.
inline constexpr char kMnemeVersion[] = "0.4.0";

}  // namespace mneme

#endif  // MNEME_COMMON_VERSION_H_
