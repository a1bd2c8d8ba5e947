// A minimal C++ engine linking the installed qmoe package.
#include <cstdio>

#include "qmoe/formats.h"
#include "qmoe/schemes.h"

int main() {
  std::printf("qmoe consumer: %zu schemes, fp4 code 7 = %g\n", qmoe::all_schemes().size(),
              qmoe::fp4_e2m1_decode(7));
  return qmoe::fp4_e2m1_decode(7) == 6.0f ? 0 : 1;
}
