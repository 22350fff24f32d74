#include "src/nvlink/board_set.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/status.h"

namespace reshard::nvlink::internal {

absl::Status BoardSet::Create(const FanoutContext& ctx, rendezvous::Record& record) {
  table_ = ctx.table;
  rank_ = ctx.rank;
  std::map<int32_t, int64_t> next;
  slot_of_.resize(table_->edges.size());
  for (uint32_t i = 0; i < table_->edges.size(); ++i) {
    const FanoutEdge& e = table_->edges[i];
    slot_of_[i] = next[e.to_rank]++;
    if (e.to_rank == rank_) {
      incoming_.push_back(i);
      peers_.push_back(e.from_rank);
      senders_.push_back(e.from_rank);
    }
    if (e.from_rank == rank_) peers_.push_back(e.to_rank);
  }
  std::sort(peers_.begin(), peers_.end());
  peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
  std::sort(senders_.begin(), senders_.end());
  senders_.erase(std::unique(senders_.begin(), senders_.end()), senders_.end());
  RESHARD_ASSIGN_OR_RETURN(board_, SignalBoard::Create(absl::StrFormat("r%d", rank_),
                                                       static_cast<int64_t>(incoming_.size())));
  ++mappings_;
  record["board"] = board_.name();
  return absl::OkStatus();
}

absl::Status BoardSet::OpenPeer(int32_t peer, const rendezvous::Record& record) {
  RESHARD_ASSIGN_OR_RETURN(std::string name, rendezvous::Field(record, "board", peer));
  int64_t slots = 0;
  for (const FanoutEdge& e : table_->edges) slots += e.to_rank == peer;
  RESHARD_ASSIGN_OR_RETURN(PeerBoard board, PeerBoard::Open(name, slots));
  boards_[peer] = std::move(board);
  ++mappings_;
  return absl::OkStatus();
}

absl::Status BoardSet::FinishSetup(const FanoutContext& ctx, const std::string& what,
                                   absl::Time deadline) {
  // Every peer opens this board: senders to signal it, receivers to watch this rank's liveness.
  RESHARD_RETURN_IF_ERROR(rendezvous::Barrier(
      *ctx.store, absl::StrCat(ctx.options.key_prefix, "/", what), rank_, peers_, deadline));
  board_.Unlink();
  return absl::OkStatus();
}

void BoardSet::Grant(uint64_t epoch) {
  epoch_ = epoch;
  pending_in_ = incoming_;
  last_doorbell_ = ~uint64_t{0};
  board_.Grant(epoch);
  // A sender may sleep waiting for this grant (BoardSet::Block).
  for (int32_t peer : senders_) boards_.at(peer).Ring();
}

bool BoardSet::Granted(int32_t peer, uint64_t epoch) const {
  return boards_.at(peer).granted() >= epoch;
}

void BoardSet::Signal(uint32_t edge, uint64_t epoch) {
  boards_.at(table_->edges[edge].to_rank).Signal(slot_of_[edge], epoch);
}

void BoardSet::Scan(uint64_t epoch, std::vector<uint32_t>* arrived) {
  // The doorbell is bumped after each slot store, so slots signalled before the doorbell value
  // we read are all visible to the scan that follows it; a ring after it ends Block().
  const uint64_t bell = board_.doorbell();
  seen_doorbell_ = bell;
  if (pending_in_.empty()) return;
  if (bell == last_doorbell_) return;
  last_doorbell_ = bell;
  size_t keep = 0;
  for (uint32_t i : pending_in_) {
    if (board_.Arrived(slot_of_[i], epoch)) {
      arrived->push_back(i);
    } else {
      pending_in_[keep++] = i;
    }
  }
  pending_in_.resize(keep);
}

absl::Status BoardSet::CheckPeers(const std::vector<int32_t>& peers) const {
  for (int32_t peer : peers) {
    auto it = boards_.find(peer);
    if (it == boards_.end()) continue;
    if (!it->second.Alive()) {
      return absl::UnavailableError(absl::StrFormat(
          "fan-out: domain peer rank %d of rank %d exited (its signal board lock was released)",
          peer, rank_));
    }
    std::string reason;
    if (epoch_ != 0 && it->second.FailedEpoch(&reason) == epoch_) {
      return absl::UnavailableError(
          absl::StrFormat("rank %d, refit epoch %d: fan-out peer rank %d failed it: %s", rank_,
                          epoch_, peer, reason));
    }
  }
  return absl::OkStatus();
}

void BoardSet::PublishFailure(uint64_t epoch, absl::string_view reason) {
  board_.PublishFailure(epoch, reason);
  for (int32_t peer : peers_) boards_.at(peer).Ring();
}

}  // namespace reshard::nvlink::internal
