#include "src/plan/dtype.h"

#include <array>

namespace reshard::plan {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int size;
};

constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::kBool, "bool", 1},
    {DType::kU8, "u8", 1},
    {DType::kI8, "i8", 1},
    {DType::kI16, "i16", 2},
    {DType::kI32, "i32", 4},
    {DType::kI64, "i64", 8},
    {DType::kFp8E4M3, "fp8e4m3", 1},
    {DType::kFp8E5M2, "fp8e5m2", 1},
    {DType::kFp16, "fp16", 2},
    {DType::kBf16, "bf16", 2},
    {DType::kFp32, "fp32", 4},
    {DType::kFp64, "fp64", 8},
}};

}  // namespace

int DTypeSize(DType t) { return kDTypes[static_cast<int>(t)].size; }

std::string_view DTypeName(DType t) { return kDTypes[static_cast<int>(t)].name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.type;
  }
  return std::nullopt;
}

std::string_view DTypeNames() {
  return "bool, u8, i8, i16, i32, i64, fp8e4m3, fp8e5m2, fp16, bf16, fp32, fp64";
}

}  // namespace reshard::plan
