// Fuzzes the spec reader, the planner and the in-process verification (`reshard plan --verify`).
//
// Input: the bytes of a spec file. Properties checked (a violation aborts, which is a finding):
// - ParseSpecJson never crashes, and rejects with InvalidArgument in one bounded line;
// - an accepted spec round-trips: SpecToJson of it parses, and writes back the same text;
// - an accepted spec within the budget below plans (BuildPlan never fails on a valid spec), the
//   spec SpecToJson wrote plans to the same fingerprint, and the plan, executed over every
//   rank's buffers in one process, verifies: every destination element holds the right value
//   and nothing outside the destination views was written.
// The plan options (schedule, relays, staging, splitting) vary with a hash of the input.
//
// Budget: planning and verifying are linear in ranks x tensors x bytes, so a valid spec of a
// few hundred bytes may name 65,536 ranks or a 2^56-byte buffer (both within the documented
// limits). The harness plans only specs that cost milliseconds, decided from the spec alone
// before planning: at most 64 ranks and 16 tensors, and at most 1 MiB of buffers over all ranks,
// bounded from above as if every rank held the whole tensor (the largest extent a view can
// reach; tests/fuzz/spec_budget.h). Larger specs are still parsed, validated and round-tripped.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/checked.h"
#include "src/common/hash.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec.h"
#include "src/plan/spec_json.h"
#include "tests/fuzz/spec_budget.h"

namespace reshard::plan {
namespace {

constexpr SpecBudget kBudget{64, 16, int64_t{1} << 20};
// Error sentences quote at most a few user strings, each cut at 64 characters (escaped, at most
// 6 bytes each: \u0000), around a position and a short sentence.
constexpr size_t kMaxErrorBytes = 2048;

void Check(bool ok, std::string_view what, std::string_view detail) {
  if (!ok) {
    fprintf(stderr, "fuzz_spec: %.*s\n%.*s\n", static_cast<int>(what.size()), what.data(),
            static_cast<int>(detail.size()), detail.data());
    std::abort();
  }
}

// Plan options vary with the input (deterministically), so every schedule and its splitting of
// pieces (at sizes small enough to happen within the budget) is exercised.
PlanOptions OptionsFor(std::string_view text) {
  const uint64_t h = HashBytes(text.data(), text.size(), 0);
  PlanOptions o;
  o.schedule = (h & 1) ? PlanOptions::Schedule::kPointToPoint : PlanOptions::Schedule::kDomainAware;
  o.spread_replicas = (h & 2) != 0;
  o.relay = (h & 4) != 0;
  o.staging = (h & 8) != 0;
  if (h & 16) {
    o.split_min_bytes = 64;
    o.split_part_bytes = 16 << ((h >> 5) & 3);
  }
  return o;
}

}  // namespace
}  // namespace reshard::plan

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace reshard::plan;  // NOLINT
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<RefitSpec> parsed = ParseSpecJson(text);
  if (!parsed.ok()) {
    const std::string message(parsed.status().message());
    Check(absl::IsInvalidArgument(parsed.status()), "a rejected spec is not InvalidArgument",
          message);
    Check(message.find('\n') == std::string::npos, "an error is not one line", message);
    Check(message.size() <= kMaxErrorBytes, "an error is longer than 2 KiB", message);
    return 0;
  }
  const std::string written = SpecToJson(*parsed);
  absl::StatusOr<RefitSpec> reparsed = ParseSpecJson(written);
  Check(reparsed.ok(), "SpecToJson wrote a spec that does not parse",
        reparsed.ok() ? written : reparsed.status().ToString() + "\n" + written);
  const std::string rewritten = SpecToJson(*reparsed);
  Check(rewritten == written, "SpecToJson does not round-trip", written + "\n" + rewritten);

  if (!WithinBudget(*parsed, kBudget)) return 0;
  auto spec = std::make_shared<const RefitSpec>(*std::move(parsed));
  absl::StatusOr<Plan> plan = BuildPlan(spec, OptionsFor(text));
  Check(plan.ok(), "a valid spec does not plan", plan.status().ToString() + "\n" + written);
  // Far above the budget: a refusal here means the plan's buffers outgrew the spec's.
  // Planning is deterministic and sees everything SpecToJson writes: the written spec plans to
  // the same fingerprint (ranks compare fingerprints before moving data).
  absl::StatusOr<Plan> replanned =
      BuildPlan(std::make_shared<const RefitSpec>(*std::move(reparsed)), OptionsFor(text));
  Check(replanned.ok() && replanned->fingerprint() == plan->fingerprint(),
        "the written spec plans to another fingerprint", written);
  const absl::Status verified = VerifyPlanInProcess(*plan, int64_t{64} << 20);
  Check(verified.ok(), "the plan does not verify", verified.ToString() + "\n" + written);
  return 0;
}
