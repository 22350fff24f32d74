// Shared by the plan tests: a rank's share (BuildRankPlan) must equal the world plan restricted
// to that rank: the transfers it sends or receives (relay feeds marked alike), and the fan-out
// transfers between two ranks of its domain. Returns "" when it does, else what differs.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/plan/plan.h"
#include "src/plan/schedule.h"

namespace reshard::plan {

inline bool SameRegion(const Plan& a, const Region& ra, const Plan& b, const Region& rb) {
  if (ra.from_offset != rb.from_offset || ra.to_offset != rb.to_offset ||
      ra.run_bytes != rb.run_bytes || ra.bytes != rb.bytes || ra.ndims != rb.ndims) {
    return false;
  }
  const RegionDim* da = a.region_dims(ra);
  const RegionDim* db = b.region_dims(rb);
  for (int i = 0; i < ra.ndims; ++i) {
    if (da[i].count != db[i].count || da[i].from_stride != db[i].from_stride ||
        da[i].to_stride != db[i].to_stride) {
      return false;
    }
  }
  return true;
}

// "" when exactly the network transfers that some network relay waits on are marked
// feeds_relay in the world plan `world`, else the first that is not.
inline std::string CheckRelayFeeds(const Plan& world) {
  const std::vector<Transfer>& transfers = world.transfers();
  std::vector<char> fed(transfers.size(), 0);
  for (const Transfer& t : transfers) {
    if (t.kind == TransferKind::kNetwork && t.after >= 0) {
      if (transfers[t.after].kind != TransferKind::kNetwork)
        return "a relay waits on no network transfer";
      fed[t.after] = 1;
    }
  }
  for (size_t i = 0; i < transfers.size(); ++i) {
    if (transfers[i].feeds_relay != (fed[i] != 0)) {
      return absl::StrCat(
          "transfer ", i,
          (fed[i] ? " feeds a relay but is not marked" : " is marked but feeds no relay"));
    }
  }
  return "";
}

inline std::string CompareRankPlan(const Plan& world, const Plan& share, int32_t rank) {
  const std::string who = absl::StrCat("rank ", rank, ": ");
  if (share.rank() != rank) return who + "rank() is not the rank planned";
  if (world.rank() != -1) return who + "the world plan's rank() is not -1";
  if (share.fingerprint() != world.fingerprint()) return who + "fingerprints differ";
  if (share.world_size() != world.world_size()) return who + "world sizes differ";
  if (share.world_transfers() != world.transfers().size()) return who + "world transfer counts differ";
  if (std::memcmp(&share.stats(), &world.stats(), sizeof(PlanStats)) != 0) {
    return who + "plan stats differ";
  }
  if (share.tensor_stats().size() != world.tensor_stats().size()) return who + "tensor stats differ";
  for (size_t t = 0; t < world.tensor_stats().size(); ++t) {
    if (std::memcmp(&share.tensor_stats()[t], &world.tensor_stats()[t], sizeof(TensorStats)) != 0) {
      return absl::StrCat(who, "stats of tensor ", t, " differ");
    }
  }
  if (share.nic_in_bytes() != world.nic_in_bytes() || share.nic_out_bytes() != world.nic_out_bytes()) {
    return who + "NIC loads differ";
  }
  if (share.buffers().size() != world.buffers().size() ||
      share.stage_buffer() != world.stage_buffer()) {
    return who + "buffers differ";
  }
  for (int32_t r = 0; r < world.world_size(); ++r) {
    if (share.stage_bytes(r) != world.stage_bytes(r)) {
      return absl::StrCat(who, "staging bytes of rank ", r, " differ");
    }
  }
  if (share.BufferBytes(rank) != world.BufferBytes(rank)) return who + "buffer sizes differ";
  // The transfers: exactly the world's that rank sends or receives, and the fan-out copies inside
  // its domain, in plan order.
  const DomainMap domains(world.spec());
  const int32_t domain = domains.domain_of(rank);
  auto in_domain = [&](int32_t r) { return domain >= 0 && domains.domain_of(r) == domain; };
  std::vector<uint32_t> expected;
  for (uint32_t i = 0; i < world.transfers().size(); ++i) {
    const Transfer& t = world.transfers()[i];
    if (t.from_rank == rank || t.to_rank == rank ||
        (t.kind == TransferKind::kFanout && in_domain(t.from_rank) && in_domain(t.to_rank))) {
      expected.push_back(i);
    }
  }
  if (share.transfers().size() != expected.size()) {
    return absl::StrCat(who, share.transfers().size(), " transfers, the world plan has ",
                        expected.size(), " for it");
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const Transfer& a = world.transfers()[expected[i]];
    const Transfer& b = share.transfers()[i];
    if (share.transfer_id(i) != expected[i]) return absl::StrCat(who, "transfer ", i, ": id differs");
    if (a.tensor != b.tensor || a.from_rank != b.from_rank || a.to_rank != b.to_rank ||
        a.after != b.after || a.kind != b.kind || a.from_side != b.from_side ||
        a.to_side != b.to_side || a.feeds_relay != b.feeds_relay) {
      return absl::StrCat(who, "transfer ", expected[i], " differs");
    }
    if (b.region >= share.num_regions() ||
        !SameRegion(world, world.region(a.region), share, share.region(b.region))) {
      return absl::StrCat(who, "region of transfer ", expected[i], " differs");
    }
  }
  // Only the regions its transfers use, and the per-rank indexes over them.
  std::vector<char> used(share.num_regions(), 0);
  for (const Transfer& t : share.transfers()) used[t.region] = 1;
  for (char u : used) {
    if (!u) return who + "keeps a region no transfer uses";
  }
  for (bool sending : {true, false}) {
    auto [wb, we] = sending ? world.sends(rank) : world.receives(rank);
    auto [sb, se] = sending ? share.sends(rank) : share.receives(rank);
    if (we - wb != se - sb) return absl::StrCat(who, sending ? "sends" : "receives", " differ");
    for (; wb != we; ++wb, ++sb) {
      if (share.transfer_id(*sb) != *wb) {
        return absl::StrCat(who, sending ? "sends" : "receives", " differ");
      }
    }
  }
  return "";
}

}  // namespace reshard::plan
