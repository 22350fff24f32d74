// Reading refit specs from JSON (DESIGN §7).
//
// Every error is InvalidArgument with one sentence: the JSON position (line, column), the tensor
// when there is one, and the field. Unknown keys are errors (only a top-level "comment" is free
// text), so a typo such as "placement" cannot pass silently. The result has passed Validate().
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "src/plan/spec.h"

namespace reshard::plan {

[[nodiscard]] absl::StatusOr<RefitSpec> ParseSpecJson(std::string_view text);
// Reads and parses a file; the path is named in every error.
[[nodiscard]] absl::StatusOr<RefitSpec> LoadSpecFile(const std::string& path);
// Writes a spec back as JSON that ParseSpecJson reads to an equal spec.
std::string SpecToJson(const RefitSpec& spec);

}  // namespace reshard::plan
