// The one record format of the rendezvous store, and the one barrier.
//
// Everything ranks swap at set-up (plan fingerprints, UCX worker addresses and remote keys,
// shared-memory names, CUDA IPC handles, NCCL unique ids, "I am wired up") is a Record: a flat
// map from field name to value, published once under `<prefix>/<what>/<rank>`. Values may hold
// any bytes; the encoding is text (one `field=<hex of value>` line per field, sorted), so it
// survives every store, including framework stores that only carry strings.
//
// Thread safety: free functions over a thread-safe Store; Records are plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "src/rendezvous/store.h"

namespace reshard::rendezvous {

using Record = std::map<std::string, std::string>;

// Field names are chosen by the code, never by a peer: non-empty, without '=' or a newline
// (RESHARD_CHECK). Values may hold any bytes.
std::string EncodeRecord(const Record& record);
// DataLoss when `text` is not an encoded record (`what` names it in the message). A record comes
// from another process: errors quote what they repeat of it (json::QuoteForMessage), so they stay
// one line of bounded length whatever the text holds.
[[nodiscard]] absl::StatusOr<Record> DecodeRecord(const std::string& text, const std::string& what);

// `<prefix>/<what>/<rank>`.
std::string RecordKey(const std::string& prefix, const std::string& what, int32_t rank);

// Publishes `rank`'s record under RecordKey(prefix, what, rank).
[[nodiscard]] absl::Status PublishRecord(Store& store, const std::string& prefix,
                                         const std::string& what, int32_t rank,
                                         const Record& record);
// Waits for `peer`'s record until `deadline`; errors name the peer and the record.
[[nodiscard]] absl::StatusOr<Record> FetchRecord(Store& store, const std::string& prefix,
                                                 const std::string& what, int32_t peer,
                                                 absl::Time deadline);

// Field `field` of `peer`'s record; InvalidArgument naming the peer and the field when missing
// or (IntField) not an integer (the value quoted and cut as in DecodeRecord).
[[nodiscard]] absl::StatusOr<std::string> Field(const Record& record, const std::string& field,
                                                int32_t peer);
[[nodiscard]] absl::StatusOr<int64_t> IntField(const Record& record, const std::string& field,
                                               int32_t peer);

// Called between the short store reads of a wait: progress a UCX worker, check peers' liveness.
// An error ends the wait with that error.
using WhileWaiting = std::function<absl::Status()>;

// Blocks until every rank of `peers` arrived at barrier `key` (this rank arrives by publishing
// `<key>/<rank>`). Waits in short store reads and calls `while_waiting` (when given) between
// them, so a caller can keep its worker progressing and fail at once when a peer is lost.
// DeadlineExceeded names `rank` and the first peer missing at `deadline`.
[[nodiscard]] absl::Status Barrier(Store& store, const std::string& key, int32_t rank,
                                   absl::Span<const int32_t> peers, absl::Time deadline,
                                   const WhileWaiting& while_waiting = {});

// Generation `generation` (1, 2, ...) of a barrier used again and again under `prefix`: a
// Barrier at `<prefix>/<generation>`. Once a rank passed generation n every rank has left n - 1,
// so it then deletes its own key of n - 1: the store holds at most two generations whatever the
// number of refits.
[[nodiscard]] absl::Status RepeatedBarrier(Store& store, const std::string& prefix,
                                           uint64_t generation, int32_t rank,
                                           absl::Span<const int32_t> peers, absl::Time deadline,
                                           const WhileWaiting& while_waiting = {});

// Every rank of `ranks` publishes `value` under `<key>/<rank>` and compares it with every other
// rank's: FailedPrecondition "<what> mismatch: rank A has X but rank B has Y; <hint>" naming
// this rank and the first rank that differs; errors of the store (DeadlineExceeded,
// Unavailable) name the rank waited for. A rank that posted a failure instead (PostFailure)
// fails the others as soon as they read it, with its status code and "rank B failed before
// agreeing on the <what>: <its message>". Values must not start with '!'.
[[nodiscard]] absl::Status CheckAgreement(Store& store, const std::string& key, int32_t rank,
                                          absl::Span<const int32_t> ranks, const std::string& value,
                                          const std::string& what, const std::string& hint,
                                          absl::Time deadline);

// For a rank that cannot reach CheckAgreement(key, ...) (its own set-up failed first): posts
// `status` (not OK; its message cut to 1 KiB) where its value belongs, so the ranks waiting for
// it fail at once instead of at their deadline. Errors are the store's.
[[nodiscard]] absl::Status PostFailure(Store& store, const std::string& key, int32_t rank,
                                       const absl::Status& status);

}  // namespace reshard::rendezvous
