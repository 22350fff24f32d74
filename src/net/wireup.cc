#include "src/net/wireup.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/fault.h"
#include "src/common/idle.h"
#include "src/common/process.h"
#include "src/common/status.h"
#include "src/rendezvous/record.h"

namespace reshard::net {

std::vector<int32_t> PeerRanks(const std::vector<std::unique_ptr<PeerLink>>& links) {
  std::vector<int32_t> ranks;
  for (size_t r = 0; r < links.size(); ++r) {
    if (links[r] != nullptr) ranks.push_back(static_cast<int32_t>(r));
  }
  return ranks;
}

namespace {

std::string LandingField(int32_t sender) { return absl::StrCat("landing.", sender); }
std::string RoundsField(int32_t sender) { return absl::StrCat("rounds.", sender); }
std::string DirectField(uint32_t id) { return absl::StrCat("direct.", id); }
std::string StridedField(uint32_t id) { return absl::StrCat("strided.", id); }

}  // namespace

absl::StatusOr<RoundSender> RoundStreamOf(const rendezvous::Record& theirs, int32_t rank,
                                          int32_t peer, uint64_t registered) {
  RoundSender s;
  s.rank = rank;
  auto field = theirs.find(RoundsField(rank));
  if (field == theirs.end()) return s;
  std::vector<std::string> parts = absl::StrSplit(field->second, ':');
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &s.offset) ||
      !absl::SimpleAtoi(parts[1], &s.quota) || !absl::SimpleAtoi(parts[2], &s.total) ||
      !absl::SimpleAtoi(parts[3], &s.slots) || s.offset < 0 || s.quota < 1 || s.total < 1 ||
      s.slots < 1 || static_cast<uint64_t>(s.quota) > registered) {
    return absl::DataLossError(absl::StrCat("the wire-up record of rank ", peer,
                                            " has a malformed ", RoundsField(rank), " field"));
  }
  const int64_t rounds = (s.total - 1) / s.quota + 1;
  if (rounds > INT32_MAX) {
    return absl::DataLossError(absl::StrCat("the wire-up record of rank ", peer, " cuts rank ",
                                            rank, "'s ", s.total, " bytes into more than ",
                                            INT32_MAX, " landing rounds"));
  }
  s.rounds = static_cast<int32_t>(rounds);
  s.slots = std::min(s.slots, s.rounds);
  // The slice: the stream, or slots * quota with slots < rounds, below the stream (no overflow).
  const auto area = static_cast<uint64_t>(s.SliceBytes());
  // Inside the registered area, and inside int64 (every later offset into it is int64).
  const uint64_t limit = std::min<uint64_t>(registered, INT64_MAX);
  if (static_cast<uint64_t>(s.offset) > limit || area > limit - static_cast<uint64_t>(s.offset)) {
    return absl::DataLossError(absl::StrCat("the wire-up record of rank ", peer, " places rank ",
                                            rank, "'s ", area, " bytes of landing rounds at ",
                                            s.offset, ", outside its ", registered,
                                            "-byte round area"));
  }
  return s;
}

absl::StatusOr<int64_t> LandingBlockOf(const rendezvous::Record& theirs, int32_t rank, int32_t peer,
                                       int64_t bytes, uint64_t registered) {
  auto field = theirs.find(LandingField(rank));
  if (field == theirs.end()) {
    return absl::DataLossError(absl::StrCat("rank ", peer,
                                            " published no landing area for packed pieces from "
                                            "rank ",
                                            rank));
  }
  std::pair<std::string, std::string> parts = absl::StrSplit(field->second, ':');
  int64_t offset = 0, reserved = 0;
  if (!absl::SimpleAtoi(parts.first, &offset) || !absl::SimpleAtoi(parts.second, &reserved) ||
      offset < 0) {
    return absl::DataLossError(absl::StrCat("the wire-up record of rank ", peer,
                                            " has a malformed ", LandingField(rank), " field"));
  }
  if (reserved != bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", peer, " expects ", reserved, " bytes of packed pieces from rank ",
                     rank, ", which packs ", bytes,
                     " (pack_below_run_bytes and the delivery must be the same on every rank)"));
  }
  // The block lies inside the registered landing area (no sum here can wrap: both are
  // non-negative and compared by difference), so every later offset into it stays small.
  if (static_cast<uint64_t>(offset) > registered ||
      static_cast<uint64_t>(bytes) > registered - static_cast<uint64_t>(offset)) {
    return absl::DataLossError(absl::StrCat("the wire-up record of rank ", peer, " places rank ",
                                            rank, "'s ", bytes, " bytes of packed pieces at ",
                                            offset, ", outside its ", registered,
                                            "-byte landing area"));
  }
  return offset;
}

absl::Status Connect(rendezvous::Store& store, const std::string& prefix, int32_t rank,
                     Runtime& runtime, const RegisteredMemory& memory,
                     absl::Span<const LandingBlock> landing_blocks, const LandingRounds& rounds,
                     std::vector<std::unique_ptr<PeerLink>>& links, bool single_copy,
                     absl::Time deadline) {
  rendezvous::Record mine;
  mine["address"] = runtime.worker().address();
  // Same-host peers watch each other's process (wireup.h).
  const std::string host = HostIdentity();
  mine["host"] = host;
  mine["process"] = ProcessId::Self().Encode();
  const std::string pidns = absl::StrCat(PidNamespace());
  mine["pidns"] = pidns;
  // assign, not = "1": gcc 12 warns there at -O3 (-Wrestrict, a false positive in an inlined
  // copy).
  mine["single_copy"].assign(1, single_copy ? '1' : '0');
  // Where a same-host peer reads this process's probe token back (SingleCopyWriter::Probe).
  mine["probe"] = absl::StrCat(reinterpret_cast<uintptr_t>(SingleCopyWriter::OwnToken()));
  mine["token"] = absl::StrCat(*SingleCopyWriter::OwnToken());
  RESHARD_RETURN_IF_ERROR(memory.AddRemoteKeys(&mine));
  for (const LandingBlock& b : landing_blocks) {
    mine[LandingField(b.rank)] = absl::StrCat(b.offset, ":", b.bytes);
  }
  for (uint32_t id = 0; id < memory.size(); ++id) {
    if (memory.direct(id)) {
      mine[DirectField(id)].assign(1, '1');
    } else if (ModeOf(rounds.modes, id) == RoundMode::kStrided) {
      mine[StridedField(id)].assign(1, '1');
    }
  }
  for (const RoundSender& r : rounds.senders) {
    mine[RoundsField(r.rank)] = absl::StrCat(r.offset, ":", r.quota, ":", r.total, ":", r.slots);
  }
  RESHARD_RETURN_IF_ERROR(rendezvous::PublishRecord(store, prefix, "wireup", rank, mine));
  for (const std::unique_ptr<PeerLink>& link : links) {
    if (link == nullptr) continue;
    RESHARD_ASSIGN_OR_RETURN(
        rendezvous::Record theirs,
        rendezvous::FetchRecord(store, prefix, "wireup", link->peer(), deadline));
    RESHARD_ASSIGN_OR_RETURN(std::string address,
                             rendezvous::Field(theirs, "address", link->peer()));
    RESHARD_RETURN_IF_ERROR(link->Connect(address, runtime.peer_error_handling()));
    // A pid names the same process only in one pid namespace (containers share the boot id).
    if (theirs.count("host") != 0 && theirs.at("host") == host && theirs.count("pidns") != 0 &&
        theirs.at("pidns") == pidns) {
      RESHARD_ASSIGN_OR_RETURN(std::string process,
                               rendezvous::Field(theirs, "process", link->peer()));
      RESHARD_ASSIGN_OR_RETURN(ProcessId id, ProcessId::Decode(process));
      link->WatchProcess(id);
      if (theirs.count("probe") != 0 && theirs.count("token") != 0) {
        uint64_t probe = 0, token = 0;
        if (!absl::SimpleAtoi(theirs.at("probe"), &probe) ||
            !absl::SimpleAtoi(theirs.at("token"), &token)) {
          return absl::DataLossError(absl::StrCat("the wire-up record of rank ", link->peer(),
                                                  " has a malformed probe or token field"));
        }
        link->set_probe(probe, token);
      }
    }
    link->set_peer_single_copy(theirs.count("single_copy") != 0 && theirs.at("single_copy") == "1");
    // Every plan buffer id, plus the landing area of packed streams.
    RESHARD_RETURN_IF_ERROR(
        link->LoadRemoteKeys(link->sends_to ? theirs : rendezvous::Record{}, memory.remote_ids()));
    if (link->sends_to) {
      // Its destinations' round modes and this rank's landing rounds into it
      // (landing_rounds.h).
      link->peer_rounds.assign(memory.size(), RoundMode::kNone);
      for (uint32_t id = 0; id < memory.size(); ++id) {
        if (theirs.count(DirectField(id)) != 0) {
          link->peer_rounds[id] = RoundMode::kAll;
        } else if (theirs.count(StridedField(id)) != 0) {
          link->peer_rounds[id] = RoundMode::kStrided;
        }
      }
      RESHARD_ASSIGN_OR_RETURN(
          link->round_to,
          RoundStreamOf(theirs, rank, link->peer(), link->remote_bytes(memory.round_id())));
      if (link->round_to.quota > 0 && link->rkey(memory.round_id()) == nullptr) {
        return absl::DataLossError(absl::StrCat("rank ", link->peer(), " published landing ",
                                                "rounds for rank ", rank, " but no round area"));
      }
    }
    auto landing = theirs.find(LandingField(rank));
    link->has_peer_landing_field = landing != theirs.end();
    if (link->has_peer_landing_field) link->peer_landing_field = landing->second;
  }
  return absl::OkStatus();
}

absl::Status PlaceLandingBlocks(int32_t rank, const RegisteredMemory& memory,
                                std::vector<std::unique_ptr<PeerLink>>& links) {
  for (const std::unique_ptr<PeerLink>& link : links) {
    if (link == nullptr || link->packed_bytes_to <= 0) continue;
    rendezvous::Record theirs;
    if (link->has_peer_landing_field) theirs[LandingField(rank)] = link->peer_landing_field;
    RESHARD_ASSIGN_OR_RETURN(const int64_t block,
                             LandingBlockOf(theirs, rank, link->peer(), link->packed_bytes_to,
                                            link->remote_bytes(memory.landing_id())));
    link->set_landing_block(block);
  }
  return absl::OkStatus();
}

absl::Status Handshake(rendezvous::Store& store, const std::string& prefix, int32_t rank,
                       Runtime& runtime, std::vector<std::unique_ptr<PeerLink>>& links,
                       absl::Time deadline) {
  common::FaultPoint(common::FaultStage::kSetup, rank, 0);
  for (const std::unique_ptr<PeerLink>& link : links) {
    if (link != nullptr) RESHARD_RETURN_IF_ERROR(link->SendHello());
  }
  // Same-host peers without UCX peer error handling (shared memory) are watched through their
  // process, read at most every 20 ms.
  absl::Time next_process_check = absl::InfinitePast();
  auto peer_error = [&](PeerLink& link, const char* doing) -> absl::Status {
    if (!link.error().ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, ": ", doing, " rank ", link.peer(),
                                                 ": ", link.error().message()));
    }
    // An abort is not a set-up failure: a peer that finished its own set-up may already have
    // started and failed the first refit (its deadline passed while this rank was still
    // waiting for a third rank's hello) and aborted it here. The link keeps the abort, and this
    // rank's first refit fails with it (RefitEngine::Impl::StartEpoch), as it would have had the
    // abort arrived a moment later; Reset() then recovers both.
    if (link.process_gone()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", rank, ": ", doing, " rank ", link.peer(), ": lost peer rank ",
                       link.peer(), ": its process (pid ", link.watched_pid(), ") exited"));
    }
    return link.hello_status();
  };
  auto check_processes = [&]() {
    const absl::Time now = absl::Now();
    if (now < next_process_check) return;
    next_process_check = now + absl::Milliseconds(20);
    for (const std::unique_ptr<PeerLink>& link : links) {
      if (link != nullptr) link->CheckProcess();
    }
  };
  IdlePolicy idle(&runtime.worker());
  while (true) {
    const bool progressed = runtime.worker().Progress() > 0;
    check_processes();
    int32_t missing = -1;
    for (const std::unique_ptr<PeerLink>& link : links) {
      if (link == nullptr) continue;
      RESHARD_RETURN_IF_ERROR(peer_error(*link, "wiring up with"));
      if ((!link->hello_received || link->hello_pending()) && missing < 0) missing = link->peer();
    }
    if (missing < 0) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, ": wiring up with rank ", missing, " did not finish before the deadline"));
    }
    idle.Round(progressed);
  }
  common::FaultPoint(common::FaultStage::kWired, rank, 0);
  return rendezvous::Barrier(
      store, absl::StrCat(prefix, "/wired"), rank, PeerRanks(links), deadline,
      [&]() -> absl::Status {
        for (int i = 0; i < 64; ++i) runtime.worker().Progress();
        check_processes();
        for (const std::unique_ptr<PeerLink>& link : links) {
          if (link == nullptr) continue;
          RESHARD_RETURN_IF_ERROR(peer_error(*link, "waiting to finish wiring up with"));
        }
        return absl::OkStatus();
      });
}

}  // namespace reshard::net
