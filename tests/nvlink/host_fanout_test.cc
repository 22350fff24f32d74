// Host fan-out backend between forked processes: byte-exact fan-out of domain-aware plans,
// arrivals counted per epoch, mappings created once, a dying peer reported before the deadline.
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "tests/nvlink/fanout_harness.h"

namespace reshard::nvlink {
namespace {

using testing::ForkRanks;
using testing::MakeScratchDir;
using testing::PlanFromJson;
using testing::ReadReport;
using testing::RunRank;

using testing::kOneToThreeReplicas;
using testing::kTp4ToTp2Dp2;

// A receiver that got everything it needed may finish and exit while its sender still waits for
// a slower receiver's grant: that is not a lost peer.
TEST(HostFanoutFailure, FinishedPeerMayExitWhileOthersLag) {
  auto plan = PlanFromJson(kOneToThreeReplicas);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int32_t> ranks = testing::FanoutRanks(*plan);
  ASSERT_EQ(ranks.size(), 3u);
  int32_t sender = -1;
  for (const plan::Transfer& tr : plan->transfers()) {
    if (tr.kind == plan::TransferKind::kFanout) sender = tr.from_rank;
  }
  std::vector<int32_t> receivers;
  for (int32_t r : ranks) {
    if (r != sender) receivers.push_back(r);
  }
  const std::string dir = MakeScratchDir();
  auto codes = ForkRanks(ranks, [&](int32_t rank) {
    testing::RankOptions opt;
    opt.epochs = 2;
    // The last receiver enters every epoch late; the other one finishes and exits first.
    if (rank == receivers.back()) opt.start_delay = absl::Milliseconds(300);
    absl::Status s = RunRank(*plan, rank, dir, testing::SharedHostMemory(), opt);
    if (!s.ok()) testing::Report(dir, rank, "error=" + std::string(s.message()));
    return s.ok() ? 0 : 1;
  });
  for (int32_t r : ranks) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": " << ReadReport(dir, r)["error"];
  }
}

TEST(HostFanoutFailure, DyingPeerIsUnavailableBeforeDeadline) {
  auto plan = PlanFromJson(kTp4ToTp2Dp2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int32_t> ranks = testing::FanoutRanks(*plan);
  // The victim: a rank that sends some fan-out piece.
  int32_t victim = -1;
  for (const plan::Transfer& tr : plan->transfers()) {
    if (tr.kind == plan::TransferKind::kFanout) {
      victim = tr.from_rank;
      break;
    }
  }
  ASSERT_GE(victim, 0);
  const std::string dir = MakeScratchDir();
  const absl::Time start = absl::Now();
  auto codes = ForkRanks(ranks, [&](int32_t rank) {
    testing::RankOptions opt;
    opt.epochs = 1;
    opt.die_after_create = rank == victim;
    opt.wait_timeout = absl::Seconds(20);
    absl::Status s = RunRank(*plan, rank, dir, testing::SharedHostMemory(), opt);
    testing::Report(dir, rank, absl::StrFormat("code=%d", static_cast<int>(s.code())));
    if (!s.ok()) testing::Report(dir, rank, "error=" + std::string(s.message()));
    return s.ok() ? 0 : 1;
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(codes[victim], 128 + SIGKILL);
  // Every rank that expected a piece from the victim fails with Unavailable, well before the
  // 20 s deadline.
  int failed = 0;
  for (const plan::Transfer& tr : plan->transfers()) {
    if (tr.kind != plan::TransferKind::kFanout || tr.from_rank != victim) continue;
    auto rep = ReadReport(dir, tr.to_rank);
    EXPECT_EQ(codes[tr.to_rank], 1) << "rank " << tr.to_rank;
    EXPECT_EQ(rep["code"], absl::StrFormat("%d", static_cast<int>(absl::StatusCode::kUnavailable)))
        << rep["error"];
    EXPECT_NE(rep["error"].find(absl::StrFormat("rank %d", victim)), std::string::npos)
        << rep["error"];
    ++failed;
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(took, absl::Seconds(15));
}

}  // namespace
}  // namespace reshard::nvlink
