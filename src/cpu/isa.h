// CPU instruction-set selection for the optimized expert kernels: the best the machine supports,
// overridable with env QMOE_CPU_ISA=scalar|avx2|avx512 or an explicit argument (tests).
#pragma once

#include <optional>
#include <string_view>

namespace qmoe::cpu {

enum class Isa { Scalar, Avx2, Avx512 };

std::string_view isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);  // nullopt for unknown names
// Whether this CPU (and OS) can run the kernels of `isa`: AVX2 needs AVX2+FMA+F16C; AVX-512 needs
// F, BW, VL, DQ and VNNI.
bool isa_supported(Isa isa);
// The best supported ISA, unless env QMOE_CPU_ISA names one (an unsupported or unknown name is a
// qmoe::Error naming the variable and the choices).
Isa default_isa();

}  // namespace qmoe::cpu
