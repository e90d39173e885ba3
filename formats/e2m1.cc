#include "formats/e2m1.h"

#include <cmath>
#include <cstdint>

namespace mneme::formats {

uint8_t FloatToE2m1(float value) {
  if (std::isnan(value)) return 0;
  const uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  const float magnitude = std::fabs(value);
  // Midpoints between neighbouring magnitudes; at a midpoint the even code
  // wins, so "<=" where the lower neighbour is even and "<" where it is odd.
  uint8_t code;
  if (magnitude <= 0.25f) {
    code = 0;
  } else if (magnitude < 0.75f) {
    code = 1;
  } else if (magnitude <= 1.25f) {
    code = 2;
  } else if (magnitude < 1.75f) {
    code = 3;
  } else if (magnitude <= 2.5f) {
    code = 4;
  } else if (magnitude < 3.5f) {
    code = 5;
  } else if (magnitude <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace mneme::formats
