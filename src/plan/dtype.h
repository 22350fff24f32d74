// Element types of DESIGN §7. Only the size matters for moving data; names are for specs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace reshard::plan {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kFp8E4M3,
  kFp8E5M2,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
};

// Size of one element in bytes.
int DTypeSize(DType t);
// Spec spelling ("bf16", "fp8e4m3", ...).
std::string_view DTypeName(DType t);
// Parses a spec spelling; nullopt when unknown.
std::optional<DType> ParseDType(std::string_view name);
// All spellings, comma separated, for error messages.
std::string_view DTypeNames();

}  // namespace reshard::plan
