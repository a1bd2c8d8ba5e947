#include "cpu/isa.h"

#include <fmt/format.h>

#include <cstdlib>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <string>

#include "qmoe/error.h"

namespace qmoe::cpu {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512bf16";
    case Isa::Amx: return "amx";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : kAllIsas)
    if (isa_name(i) == name) return i;
  return std::nullopt;
}

namespace {

// Linux hands out AMX tile data (8 KB of extended state per thread) only to processes that ask
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, kernel 5.16+); a tile instruction
// without that permission faults. Asked once per process; false where it is refused or unknown.
bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512Bf16: return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
    case Isa::Amx:
      return isa_supported(Isa::Avx512Bf16) && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
             __builtin_cpu_supports("amx-int8") && amx_permitted();
  }
  return false;
}

Isa default_isa() {
  if (const char* env = std::getenv("QMOE_CPU_ISA"); env != nullptr && *env != '\0') {
    const auto isa = isa_from_name(env);
    if (!isa) throw Error(fmt::format("QMOE_CPU_ISA='{}' is not one of scalar, avx2, avx512, avx512bf16, amx", env));
    if (!isa_supported(*isa))
      throw Error(fmt::format("QMOE_CPU_ISA={} is not supported by this CPU", env));
    return *isa;
  }
  static const Isa best = [] {
    Isa b = Isa::Scalar;
    for (Isa i : kAllIsas)
      if (isa_supported(i)) b = i;
    return b;
  }();
  return best;
}

}  // namespace qmoe::cpu
