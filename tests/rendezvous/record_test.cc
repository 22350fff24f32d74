// The one record format and the one barrier of the rendezvous layer (src/rendezvous/record.h).
#include "src/rendezvous/record.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/rendezvous/file_store.h"
#include "tests/testing/multiprocess.h"

namespace reshard::rendezvous {
namespace {

std::unique_ptr<FileStore> NewStore() {
  const std::string dir = testing::ScratchDir("record-test");
  EXPECT_NE(dir, "");
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

TEST(RecordTest, RoundTripsAnyBytes) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  const Record record = {{"addr", binary}, {"empty", ""}, {"name", "r3-qkv"}, {"n", "42"}};
  const std::string text = EncodeRecord(record);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  absl::StatusOr<Record> back = DecodeRecord(text, "test record");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, record);
  EXPECT_EQ(*IntField(*back, "n", 3), 42);
}

TEST(RecordTest, MalformedTextIsDataLossNamingTheRecord) {
  for (const std::string text : {"no-equals\n", "=00\n", "odd=abc\n", "bad=zz\n"}) {
    absl::StatusOr<Record> r = DecodeRecord(text, "addr record of rank 5");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "addr record of rank 5"))
        << r.status().message();
  }
}

TEST(RecordTest, MissingAndNonIntegerFieldsNameThePeer) {
  const Record record = {{"pid", "x1"}};
  absl::StatusOr<std::string> missing = Field(record, "board", 7);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "rank 7"));
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "\"board\""));
  absl::StatusOr<int64_t> bad = IntField(record, "pid", 7);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// fuzz_record found IntField repeating a peer's whole value raw (tests/fuzz/regressions/record/):
// errors about what a peer sent quote it escaped and cut, so they stay one bounded line.
TEST(RecordTest, ErrorsQuoteAndBoundWhatAPeerSent) {
  const std::string junk = std::string(10000, '\xff') + "\n\x01\"";
  auto expect_bounded = [](const absl::Status& status, absl::StatusCode code) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_LT(status.message().size(), 1024u) << status;
    EXPECT_EQ(status.message().find('\n'), std::string::npos) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "\\xff")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "...")) << status;
  };
  expect_bounded(IntField({{"pid", junk}}, "pid", 7).status(), absl::StatusCode::kInvalidArgument);
  expect_bounded(DecodeRecord(std::string(10000, '\xff') + "=zz\n", "addr record").status(),
                 absl::StatusCode::kDataLoss);
  expect_bounded(DecodeRecord(std::string(10000, '\xff') + "\n", "addr record").status(),
                 absl::StatusCode::kDataLoss);
  absl::StatusOr<int64_t> bad = IntField({{"pid", "x\n1"}}, "pid", 7);
  EXPECT_EQ(bad.status().message(),
            "the set-up record of rank 7: field \"pid\" = \"x\\n1\" is not an integer");
}

TEST(RecordDeathTest, FieldNamesThatCannotBeDecodedAreABug) {
  for (const std::string field : {"", "a=b", "a\nb"}) {
    EXPECT_DEATH(EncodeRecord({{field, "v"}}), "record field names") << field;
  }
}

TEST(RecordTest, PublishAndFetchThroughAStore) {
  auto store = NewStore();
  ASSERT_TRUE(PublishRecord(*store, "h0/net", "addr", 2, {{"worker", "\x01\x02"}}).ok());
  absl::StatusOr<Record> r =
      FetchRecord(*store, "h0/net", "addr", 2, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->at("worker"), "\x01\x02");
  absl::StatusOr<Record> absent =
      FetchRecord(*store, "h0/net", "addr", 3, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(absent.status().message(), "rank 3's addr record"))
      << absent.status().message();
}

TEST(BarrierTest, EveryRankLeavesOnceAllArrived) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1, 2, 3};
  std::atomic<int> arrived{0};
  std::atomic<int> left_early{0};
  std::vector<std::thread> threads;
  for (int32_t r : ranks) {
    threads.emplace_back([&, r] {
      absl::SleepFor(absl::Milliseconds(20 * r));
      arrived++;
      absl::Status st = Barrier(*store, "b", r, ranks, absl::Now() + absl::Seconds(10),
                                [] { return absl::OkStatus(); });
      EXPECT_TRUE(st.ok()) << st;
      if (arrived.load() != static_cast<int>(ranks.size())) left_early++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(left_early.load(), 0);
}

TEST(BarrierTest, DeadlineNamesTheMissingPeer) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1, 2};
  ASSERT_TRUE(store->Set("b/1", "1").ok());
  absl::Status st = Barrier(*store, "b", 0, ranks, absl::Now() + absl::Milliseconds(60));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 2 did not arrive")) << st.message();
}

TEST(BarrierTest, WhileWaitingRunsAndItsErrorEndsTheWait) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1};
  int calls = 0;
  absl::Status st = Barrier(*store, "b", 0, ranks, absl::Now() + absl::Seconds(10), [&] {
    return ++calls < 3 ? absl::OkStatus() : absl::UnavailableError("rank 1 is gone");
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 3);
}

TEST(BarrierTest, RepeatedBarrierKeepsTheStoreBounded) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1, 2, 3};
  constexpr uint64_t kGenerations = 60;
  std::vector<std::thread> threads;
  for (int32_t r : ranks) {
    threads.emplace_back([&, r] {
      for (uint64_t g = 1; g <= kGenerations; ++g) {
        absl::Status st =
            RepeatedBarrier(*store, "h/barrier", g, r, ranks, absl::Now() + absl::Seconds(10));
        ASSERT_TRUE(st.ok()) << st;
      }
    });
  }
  for (auto& t : threads) t.join();
  // Only the last generation is left: one key per rank, not 60.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> keys = store->List("h/barrier/");
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), ranks.size());
  for (const auto& [key, value] : *keys) {
    EXPECT_EQ(key.rfind("h/barrier/60/", 0), 0u) << key;
  }
}

TEST(CheckAgreementTest, EqualValuesPassAndADifferentOneNamesBothRanks) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1};
  std::thread other([&] {
    EXPECT_TRUE(CheckAgreement(*store, "fp", 1, ranks, "abc", "plan fingerprint", "same spec",
                               absl::Now() + absl::Seconds(10))
                    .ok());
  });
  EXPECT_TRUE(CheckAgreement(*store, "fp", 0, ranks, "abc", "plan fingerprint", "same spec",
                             absl::Now() + absl::Seconds(10))
                  .ok());
  other.join();
  ASSERT_TRUE(store->Set("fp2/1", "xyz").ok());
  absl::Status st = CheckAgreement(*store, "fp2", 0, ranks, "abc", "plan fingerprint", "same spec",
                                   absl::Now() + absl::Seconds(10));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(st.message(),
                                "plan fingerprint mismatch: rank 0 has abc but "
                                "rank 1 has xyz; same spec"))
      << st.message();
}

// A rank whose set-up failed before it could agree posts its failure: the others fail at once
// with its code and reason, naming it, instead of waiting for their deadline.
TEST(CheckAgreementTest, APostedFailureFailsTheOthersAtOnceNamingTheRank) {
  auto store = NewStore();
  const std::vector<int32_t> ranks = {0, 1, 2};
  ASSERT_TRUE(store->Set("fp/1", "abc").ok());
  ASSERT_TRUE(PostFailure(*store, "fp", 2,
                          absl::InvalidArgumentError("tensor \"w\" on rank 2: buffers overlap"))
                  .ok());
  const absl::Time start = absl::Now();
  absl::Status st = CheckAgreement(*store, "fp", 0, ranks, "abc", "plan fingerprint", "same spec",
                                   absl::Now() + absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(),
                                "rank 2 failed before agreeing on the plan fingerprint: tensor "
                                "\"w\" on rank 2: buffers overlap"))
      << st.message();
  // A malformed failure is refused, not trusted.
  ASSERT_TRUE(store->Set("fp3/1", "!failed 99 x").ok());
  st = CheckAgreement(*store, "fp3", 0, {0, 1}, "abc", "plan fingerprint", "same spec",
                      absl::Now() + absl::Seconds(10));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
}

}  // namespace
}  // namespace reshard::rendezvous
