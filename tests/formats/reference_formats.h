#ifndef MNEME_TESTS_FORMATS_REFERENCE_FORMATS_H_
#define MNEME_TESTS_FORMATS_REFERENCE_FORMATS_H_

// Independent reference definitions of the narrow formats for tests: values
// as doubles from the format definitions (ldexp of sign, exponent and
// mantissa fields), and nearest-value searches by brute force. Shares no code
// with formats/.

#include <cmath>
#include <cstdint>
#include <limits>

namespace mneme::formats::reference {

// e4m3 "fn": bias 7, no inf, 0x7F/0xFF NaN.
inline double ReferenceE4m3(uint8_t code) {
  if ((code & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const int sign = code >> 7;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -9)
                               : std::ldexp(8 + mantissa, exponent - 7 - 3);
  return sign ? -magnitude : magnitude;
}

// UE8M0: 2^(code - 127), 255 NaN.
inline double ReferenceUe8m0(uint8_t code) {
  if (code == 255) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, code - 127);
}

// e2m1: bias 1, one mantissa bit, bit 3 the sign.
inline double ReferenceE2m1(uint8_t code) {
  const int sign = (code >> 3) & 1;
  const int exponent = (code >> 1) & 0x3;
  const int mantissa = code & 0x1;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -1)
                               : std::ldexp(2 + mantissa, exponent - 1 - 1);
  return sign ? -magnitude : magnitude;
}

// The code in [0, count) whose value (by `decode`, NaN codes skipped) is
// nearest to `x`, ties to the even code; `x` beyond the largest magnitude
// saturates. Works for sign-magnitude formats whose codes of one sign are
// ordered by value, as e4m3 and e2m1 are.
template <typename Decode>
uint8_t ReferenceNearest(double x, int count, Decode decode) {
  int best = -1;
  double best_distance = 0.0;
  for (int code = 0; code < count; ++code) {
    const double value = decode(static_cast<uint8_t>(code));
    if (std::isnan(value)) continue;
    // Only codes of x's sign (zero of the other sign never wins).
    if (std::signbit(value) != std::signbit(x)) continue;
    const double distance = std::fabs(value - x);
    if (best < 0 || distance < best_distance ||
        (distance == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

}  // namespace mneme::formats::reference

#endif  // MNEME_TESTS_FORMATS_REFERENCE_FORMATS_H_
