#include "reshard/reshard_c.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "reshard/reshard.h"
#include "src/api/internal.h"
#include "src/common/status.h"

struct reshard_comm {
  reshard::Communicator comm;
};
// The tiles of one (rank, side) and their C views, which point into `tiles`.
struct TileCache {
  int32_t rank = 0;
  reshard::Side side = reshard::Side::kSource;
  std::vector<reshard::LocalTile> tiles;
  std::vector<reshard_tile_info_t> infos;
};
struct reshard_spec {
  reshard::RefitSpec spec;
  // What was asked so far, per rank (and side). Deques: growing one never moves its elements,
  // whose strings the returned `const char*` point into (a short std::string keeps its
  // characters inside the object, so moving it would leave them dangling).
  std::deque<std::pair<int32_t, std::vector<reshard::BufferRequirement>>> requirements;
  std::deque<TileCache> tiles;
};
struct reshard_handle {
  reshard::RefitHandle handle;
};
// Filled by a store callback, read by the adapter once it returns.
struct reshard_store_result {
  std::string value;
  bool has_value = false;
  std::vector<std::pair<std::string, std::string>> entries;
  std::string error;
};

#define RESHARD_SAME_DTYPE(c, cc) \
  static_assert(static_cast<int>(c) == static_cast<int>(reshard::DType::cc), #c " drifted")
RESHARD_SAME_DTYPE(RESHARD_DTYPE_BOOL, kBool);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_U8, kU8);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_I8, kI8);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_I16, kI16);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_I32, kI32);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_I64, kI64);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_FP8E4M3, kFp8E4M3);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_FP8E5M2, kFp8E5M2);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_FP16, kFp16);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_BF16, kBf16);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_FP32, kFp32);
RESHARD_SAME_DTYPE(RESHARD_DTYPE_FP64, kFp64);
#undef RESHARD_SAME_DTYPE

namespace {

thread_local std::string last_error;

reshard_status_t Report(const absl::Status& status) {
  if (status.ok()) return RESHARD_OK;
  last_error = status.ToString();
  return static_cast<reshard_status_t>(static_cast<int>(status.code()));
}

reshard_status_t Invalid(const char* message) {
  return Report(absl::InvalidArgumentError(message));
}

absl::Duration Timeout(int64_t ms) { return ms > 0 ? absl::Milliseconds(ms) : absl::Seconds(30); }

}  // namespace

extern "C" {

const char* reshard_last_error(void) { return last_error.c_str(); }
const char* reshard_version(void) { return reshard::Version(); }

reshard_status_t reshard_comm_connect(const char* store_address, const char* token, int32_t rank,
                                      int32_t world_size, int32_t serve_store, int64_t timeout_ms,
                                      reshard_comm_t** out) {
  if (store_address == nullptr || token == nullptr || out == nullptr) {
    return Invalid("reshard_comm_connect: store_address, token and out must not be NULL");
  }
  reshard::Communicator::Options options;
  options.serve_store = serve_store != 0;
  options.timeout = Timeout(timeout_ms);
  auto comm = reshard::Communicator::Connect(store_address, token, rank, world_size, options);
  if (!comm.ok()) return Report(comm.status());
  *out = new reshard_comm{std::move(comm).value()};
  return RESHARD_OK;
}

reshard_status_t reshard_comm_from_env(reshard_comm_t** out) {
  if (out == nullptr) return Invalid("reshard_comm_from_env: out must not be NULL");
  auto comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) return Report(comm.status());
  *out = new reshard_comm{std::move(comm).value()};
  return RESHARD_OK;
}

int32_t reshard_comm_rank(const reshard_comm_t* comm) { return comm ? comm->comm.rank() : -1; }
int32_t reshard_comm_local_rank(const reshard_comm_t* comm) {
  return comm ? comm->comm.local_rank() : -1;
}
int32_t reshard_comm_world_size(const reshard_comm_t* comm) {
  return comm ? comm->comm.world_size() : -1;
}
void reshard_comm_destroy(reshard_comm_t* comm) { delete comm; }

}  // extern "C"

// C++ helpers: outside the C-linkage block, so they may return C++ types.
namespace {

// The C callbacks, shared by the std::functions of the C++ adapter; the last of them to go
// releases `user`, so release runs exactly once, after the last call.
struct CStoreState {
  reshard_store_callbacks_t cb;
  ~CStoreState() {
    if (cb.release != nullptr) cb.release(cb.user);
  }
};

// A callback's return code (and message) as a status naming the callback and the key.
absl::Status FromCallback(const char* callback, int32_t code, const std::string& key,
                          const reshard_store_result& result) {
  if (code == RESHARD_OK) return absl::OkStatus();
  const bool known = code > RESHARD_OK && code <= RESHARD_UNAUTHENTICATED;
  std::string message =
      result.error.empty()
          ? absl::StrCat("the store's ", callback, " callback failed with code ", code, " for \"",
                         key, "\"")
          : absl::StrCat("the store's ", callback, " callback for \"", key, "\": ", result.error);
  if (!known) absl::StrAppend(&message, " (", code, " is no reshard_status_t)");
  return absl::Status(known ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                      message);
}

reshard::StoreCallbacks Adapt(std::shared_ptr<const CStoreState> state) {
  reshard::StoreCallbacks out;
  out.set = [state](const std::string& key, const std::string& value) {
    reshard_store_result result;
    const int32_t code = state->cb.set(state->cb.user, key.c_str(), value.data(),
                                       static_cast<int64_t>(value.size()), &result);
    return FromCallback("set", code, key, result);
  };
  out.get = [state](const std::string& key,
                    absl::Time deadline) -> absl::StatusOr<std::string> {
    // Rounded up, so a wait of a few microseconds is a 1 ms wait, not a busy look.
    const absl::Duration left = deadline - absl::Now();
    const int64_t timeout_ms =
        left <= absl::ZeroDuration()
            ? 0
            : absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
    reshard_store_result result;
    const int32_t code = state->cb.get(state->cb.user, key.c_str(), timeout_ms, &result);
    RESHARD_RETURN_IF_ERROR(FromCallback("get", code, key, result));
    if (!result.has_value) {
      return absl::InternalError(
          absl::StrCat("the store's get callback returned RESHARD_OK for \"", key,
                       "\" without a value (reshard_store_result_set_value)"));
    }
    return std::move(result.value);
  };
  if (state->cb.list != nullptr) {
    out.list = [state](const std::string& prefix)
        -> absl::StatusOr<std::vector<std::pair<std::string, std::string>>> {
      reshard_store_result result;
      const int32_t code = state->cb.list(state->cb.user, prefix.c_str(), &result);
      RESHARD_RETURN_IF_ERROR(FromCallback("list", code, prefix, result));
      std::sort(result.entries.begin(), result.entries.end());
      return std::move(result.entries);
    };
  }
  if (state->cb.delete_key != nullptr) {
    out.del = [state](const std::string& key) {
      reshard_store_result result;
      return FromCallback("delete_key", state->cb.delete_key(state->cb.user, key.c_str(), &result),
                          key, result);
    };
  }
  return out;
}

}  // namespace

extern "C" {

reshard_status_t reshard_comm_from_callbacks(const reshard_store_callbacks_t* callbacks,
                                             int32_t rank, int32_t world_size, int64_t timeout_ms,
                                             reshard_comm_t** out) {
  if (callbacks == nullptr) {
    return Invalid("reshard_comm_from_callbacks: callbacks must not be NULL");
  }
  // Owned from here on, so every return below releases `user` when nothing else holds it.
  auto state = std::make_shared<CStoreState>();
  state->cb = *callbacks;
  if (out == nullptr) return Invalid("reshard_comm_from_callbacks: out must not be NULL");
  if (callbacks->set == nullptr || callbacks->get == nullptr) {
    return Invalid(callbacks->set == nullptr
                       ? "reshard_comm_from_callbacks: the set callback is NULL (it is required)"
                       : "reshard_comm_from_callbacks: the get callback is NULL (it is required)");
  }
  auto comm = reshard::Communicator::FromCallbacks(Adapt(std::move(state)), rank, world_size);
  if (!comm.ok()) return Report(comm.status());
  comm->impl()->timeout = Timeout(timeout_ms);
  *out = new reshard_comm{std::move(comm).value()};
  return RESHARD_OK;
}

reshard_status_t reshard_store_result_set_value(reshard_store_result_t* result, const void* value,
                                                int64_t value_size) {
  if (result == nullptr || value_size < 0 || (value == nullptr && value_size > 0)) {
    return Invalid(
        "reshard_store_result_set_value: result is NULL, value_size negative, or value NULL with "
        "bytes to copy");
  }
  if (value_size == 0) {
    result->value.clear();
  } else {
    result->value.assign(static_cast<const char*>(value), static_cast<size_t>(value_size));
  }
  result->has_value = true;
  return RESHARD_OK;
}

reshard_status_t reshard_store_result_add_entry(reshard_store_result_t* result, const char* key,
                                                const void* value, int64_t value_size) {
  if (result == nullptr || key == nullptr || value_size < 0 ||
      (value == nullptr && value_size > 0)) {
    return Invalid(
        "reshard_store_result_add_entry: result or key is NULL, value_size negative, or value "
        "NULL with bytes to copy");
  }
  result->entries.emplace_back(key, value_size == 0 ? std::string()
                                                   : std::string(static_cast<const char*>(value),
                                                                 static_cast<size_t>(value_size)));
  return RESHARD_OK;
}

void reshard_store_result_set_error(reshard_store_result_t* result, const char* message) {
  if (result != nullptr && message != nullptr) result->error = message;
}

reshard_status_t reshard_spec_from_json(const char* json, reshard_spec_t** out) {
  if (json == nullptr || out == nullptr) {
    return Invalid("reshard_spec_from_json: json and out must not be NULL");
  }
  auto spec = reshard::RefitSpec::FromJson(json);
  if (!spec.ok()) return Report(spec.status());
  *out = new reshard_spec{std::move(spec).value(), {}, {}};
  return RESHARD_OK;
}

reshard_status_t reshard_spec_from_file(const char* path, reshard_spec_t** out) {
  if (path == nullptr || out == nullptr) {
    return Invalid("reshard_spec_from_file: path and out must not be NULL");
  }
  auto spec = reshard::RefitSpec::FromFile(path);
  if (!spec.ok()) return Report(spec.status());
  *out = new reshard_spec{std::move(spec).value(), {}, {}};
  return RESHARD_OK;
}

int32_t reshard_spec_world_size(const reshard_spec_t* spec) {
  return spec ? spec->spec.WorldSize() : -1;
}

}  // extern "C"

namespace {
absl::StatusOr<const std::vector<reshard::BufferRequirement>*> RequirementsOf(reshard_spec_t* spec,
                                                                              int32_t rank) {
  for (const auto& [r, reqs] : spec->requirements) {
    if (r == rank) return &reqs;
  }
  auto reqs = spec->spec.LocalBuffers(rank);
  if (!reqs.ok()) return reqs.status();
  spec->requirements.emplace_back(rank, std::move(reqs).value());
  return &spec->requirements.back().second;
}
}  // namespace

extern "C" {

reshard_status_t reshard_spec_buffer_count(reshard_spec_t* spec, int32_t rank, int32_t* count) {
  if (spec == nullptr || count == nullptr) {
    return Invalid("reshard_spec_buffer_count: spec and count must not be NULL");
  }
  auto reqs = RequirementsOf(spec, rank);
  if (!reqs.ok()) return Report(reqs.status());
  *count = static_cast<int32_t>((*reqs)->size());
  return RESHARD_OK;
}

reshard_status_t reshard_spec_buffer_info(reshard_spec_t* spec, int32_t rank, int32_t index,
                                          const char** name, int32_t* side, int64_t* bytes) {
  if (spec == nullptr || name == nullptr || side == nullptr || bytes == nullptr) {
    return Invalid("reshard_spec_buffer_info: no argument may be NULL");
  }
  auto reqs = RequirementsOf(spec, rank);
  if (!reqs.ok()) return Report(reqs.status());
  if (index < 0 || index >= static_cast<int32_t>((*reqs)->size())) {
    return Report(absl::OutOfRangeError("reshard_spec_buffer_info: index out of range"));
  }
  const reshard::BufferRequirement& r = (**reqs)[index];
  *name = r.name.c_str();
  *side = static_cast<int32_t>(r.side);
  *bytes = r.bytes;
  return RESHARD_OK;
}

}  // extern "C"

namespace {
absl::StatusOr<const TileCache*> TilesOf(reshard_spec_t* spec, int32_t rank, int32_t side,
                                         const char* who) {
  if (side != RESHARD_SOURCE && side != RESHARD_DESTINATION) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": side ", side, " is neither RESHARD_SOURCE nor RESHARD_DESTINATION"));
  }
  const auto s = static_cast<reshard::Side>(side);
  for (const TileCache& c : spec->tiles) {
    if (c.rank == rank && c.side == s) return &c;
  }
  absl::StatusOr<std::vector<reshard::LocalTile>> tiles = spec->spec.LocalTiles(rank, s);
  if (!tiles.ok()) return tiles.status();
  TileCache& c = spec->tiles.emplace_back();
  c.rank = rank;
  c.side = s;
  c.tiles = *std::move(tiles);
  // The views are made once the tiles sit where they stay.
  for (const reshard::LocalTile& t : c.tiles) {
    reshard_tile_info_t info{};
    info.tensor = t.tensor.c_str();
    info.buffer = t.buffer.c_str();
    info.side = static_cast<int32_t>(t.side);
    info.dtype = static_cast<int32_t>(t.dtype);
    info.dtype_name = reshard::DTypeName(t.dtype);
    info.ndim = static_cast<int32_t>(t.global_shape.size());
    if (info.ndim > 0) {
      info.global_shape = t.global_shape.data();
      info.lo = t.lo.data();
      info.hi = t.hi.data();
      info.strides = t.strides.data();
    }
    info.offset = t.offset;
    info.num_elements = t.num_elements();
    info.scales_of = t.scales_of.c_str();
    c.infos.push_back(info);
  }
  return &c;
}

bool IsDType(int32_t dtype) {
  return dtype >= RESHARD_DTYPE_BOOL && dtype <= RESHARD_DTYPE_FP64;
}
}  // namespace

extern "C" {

reshard_status_t reshard_spec_tile_count(reshard_spec_t* spec, int32_t rank, int32_t side,
                                         int32_t* count) {
  if (spec == nullptr || count == nullptr) {
    return Invalid("reshard_spec_tile_count: spec and count must not be NULL");
  }
  auto tiles = TilesOf(spec, rank, side, "reshard_spec_tile_count");
  if (!tiles.ok()) return Report(tiles.status());
  *count = static_cast<int32_t>((*tiles)->infos.size());
  return RESHARD_OK;
}

reshard_status_t reshard_spec_tile_info(reshard_spec_t* spec, int32_t rank, int32_t side,
                                        int32_t index, reshard_tile_info_t* out) {
  if (spec == nullptr || out == nullptr) {
    return Invalid("reshard_spec_tile_info: spec and out must not be NULL");
  }
  auto tiles = TilesOf(spec, rank, side, "reshard_spec_tile_info");
  if (!tiles.ok()) return Report(tiles.status());
  const std::vector<reshard_tile_info_t>& infos = (*tiles)->infos;
  if (index < 0 || index >= static_cast<int32_t>(infos.size())) {
    return Report(absl::OutOfRangeError(
        absl::StrCat("reshard_spec_tile_info: index ", index, " is outside the ", infos.size(),
                     " tiles of rank ", rank, " on the ", side == RESHARD_SOURCE ? "source" : "destination",
                     " side")));
  }
  *out = infos[index];
  return RESHARD_OK;
}

const char* reshard_dtype_name(int32_t dtype) {
  return IsDType(dtype) ? reshard::DTypeName(static_cast<reshard::DType>(dtype)) : nullptr;
}
int32_t reshard_dtype_size(int32_t dtype) {
  return IsDType(dtype) ? reshard::DTypeSize(static_cast<reshard::DType>(dtype)) : 0;
}

void reshard_spec_destroy(reshard_spec_t* spec) { delete spec; }

reshard_status_t reshard_handle_create(reshard_comm_t* comm, const reshard_spec_t* spec,
                                       const reshard_buffer_t* buffers, int32_t num_buffers,
                                       const char* name, int32_t schedule, reshard_handle_t** out) {
  return reshard_handle_create_with_timeout(comm, spec, buffers, num_buffers, name, schedule, 0,
                                            out);
}

reshard_status_t reshard_handle_create_with_timeout(reshard_comm_t* comm,
                                                    const reshard_spec_t* spec,
                                                    const reshard_buffer_t* buffers,
                                                    int32_t num_buffers, const char* name,
                                                    int32_t schedule, int64_t setup_timeout_ms,
                                                    reshard_handle_t** out) {
  reshard_handle_options_t options{};
  options.name = name;
  options.schedule = schedule;
  options.setup_timeout_ms = setup_timeout_ms;
  return reshard_handle_create_with_options(comm, spec, buffers, num_buffers, &options,
                                            sizeof(options), out);
}

reshard_status_t reshard_handle_create_with_options(reshard_comm_t* comm,
                                                    const reshard_spec_t* spec,
                                                    const reshard_buffer_t* buffers,
                                                    int32_t num_buffers,
                                                    const reshard_handle_options_t* given,
                                                    size_t given_size, reshard_handle_t** out) {
  if (comm == nullptr || spec == nullptr) {
    return Invalid("reshard_handle_create: comm and spec must not be NULL");
  }
  if (given == nullptr) return Invalid("reshard_handle_create: options must not be NULL");
  // A caller compiled against an older header passes a shorter struct: the rest is defaults.
  reshard_handle_options_t o{};
  std::memcpy(&o, given, std::min(given_size, sizeof(o)));
  reshard::HandleOptions options;
  if (o.name != nullptr) options.name = o.name;
  if (o.setup_timeout_ms > 0) options.setup_timeout = absl::Milliseconds(o.setup_timeout_ms);
  options.schedule = o.schedule == RESHARD_SCHEDULE_POINT_TO_POINT
                         ? reshard::Schedule::kPointToPoint
                         : reshard::Schedule::kDomainAware;
  options.delta = o.delta != 0;
  if (o.stage_ring_bytes > 0) options.stage_ring_bytes = o.stage_ring_bytes;
  if (o.stage_landing_bytes > 0) options.stage_landing_bytes = o.stage_landing_bytes;
  if (o.stage_round_bytes > 0) options.stage_round_bytes = o.stage_round_bytes;
  // A call refused here still takes its part in the collective set-up: the other ranks learn
  // of the failure at once (RefitHandle::Abandon) instead of at their set-up deadline.
  auto refuse = [&](const char* message) {
    return Report(reshard::RefitHandle::Abandon(comm->comm, spec->spec,
                                                absl::InvalidArgumentError(message), options));
  };
  if (out == nullptr || (num_buffers > 0 && buffers == nullptr) || num_buffers < 0) {
    return refuse("reshard_handle_create: out (and buffers) must not be NULL");
  }
  reshard::LocalBuffers local;
  for (int32_t i = 0; i < num_buffers; ++i) {
    const reshard_buffer_t& b = buffers[i];
    if (b.name == nullptr) return refuse("reshard_handle_create: a buffer has no name");
    if (b.side != RESHARD_SOURCE && b.side != RESHARD_DESTINATION) {
      return refuse("reshard_handle_create: a buffer's side is neither source nor destination");
    }
    if (b.memory_kind != RESHARD_MEMORY_HOST && b.memory_kind != RESHARD_MEMORY_CUDA) {
      return refuse("reshard_handle_create: a buffer's memory kind is neither host nor cuda");
    }
    local.Add(static_cast<reshard::Side>(b.side), b.name,
              reshard::Buffer{b.data, b.bytes, static_cast<reshard::MemoryKind>(b.memory_kind)});
  }
  auto handle = reshard::RefitHandle::Create(comm->comm, spec->spec, std::move(local), options);
  if (!handle.ok()) return Report(handle.status());
  *out = new reshard_handle{std::move(handle).value()};
  return RESHARD_OK;
}

reshard_status_t reshard_handle_abandon(reshard_comm_t* comm, const reshard_spec_t* spec,
                                        const char* name, int32_t code,
                                        const char* message) {
  if (comm == nullptr || spec == nullptr) {
    return Invalid("reshard_handle_abandon: comm and spec must not be NULL");
  }
  reshard::HandleOptions options;
  if (name != nullptr) options.name = name;
  const absl::StatusCode status_code = code > 0 && code <= RESHARD_UNAUTHENTICATED
                                           ? static_cast<absl::StatusCode>(code)
                                           : absl::StatusCode::kUnknown;
  const absl::Status why = code == RESHARD_OK
                               ? absl::OkStatus()  // Abandon names it: "... without saying why"
                               : absl::Status(status_code, message != nullptr ? message : "");
  return Report(reshard::RefitHandle::Abandon(comm->comm, spec->spec, why, options));
}

reshard_status_t reshard_handle_execute(reshard_handle_t* handle, int64_t timeout_ms) {
  if (handle == nullptr) return Invalid("reshard_handle_execute: handle is NULL");
  return Report(handle->handle.Execute(absl::Now() + Timeout(timeout_ms)));
}
reshard_status_t reshard_handle_start(reshard_handle_t* handle) {
  if (handle == nullptr) return Invalid("reshard_handle_start: handle is NULL");
  return Report(handle->handle.Start());
}
reshard_status_t reshard_handle_start_on_stream(reshard_handle_t* handle, void* stream) {
  if (handle == nullptr) return Invalid("reshard_handle_start_on_stream: handle is NULL");
  return Report(handle->handle.StartOnStream(stream));
}
reshard_status_t reshard_handle_record_completion(reshard_handle_t* handle, void* stream) {
  if (handle == nullptr) return Invalid("reshard_handle_record_completion: handle is NULL");
  return Report(handle->handle.RecordCompletion(stream));
}
reshard_status_t reshard_handle_wait(reshard_handle_t* handle, int64_t timeout_ms) {
  if (handle == nullptr) return Invalid("reshard_handle_wait: handle is NULL");
  return Report(handle->handle.Wait(absl::Now() + Timeout(timeout_ms)));
}
void reshard_handle_reset(reshard_handle_t* handle) {
  if (handle != nullptr) handle->handle.Reset();
}

reshard_status_t reshard_handle_stats(const reshard_handle_t* handle, reshard_stats_t* out) {
  if (handle == nullptr || out == nullptr) {
    return Invalid("reshard_handle_stats: handle and out must not be NULL");
  }
  const reshard::Stats& s = handle->handle.stats();
  out->epoch = s.epoch;
  out->bytes_network_sent = s.bytes_network_sent;
  out->bytes_network_received = s.bytes_network_received;
  out->bytes_local = s.bytes_local;
  out->pieces_received = s.pieces_received;
  out->pieces_expected = s.pieces_expected;
  out->puts = s.puts;
  out->registrations_this_refit = s.registrations_this_refit;
  out->start_seconds = s.start_seconds;
  out->wait_seconds = s.wait_seconds;
  out->total_seconds = s.total_seconds;
  out->data_messages = s.data_messages;
  out->single_copy_writes = s.single_copy_writes;
  out->mapped_copies = s.mapped_copies;
  out->quantize_seconds = s.quantize_seconds;
  out->amax_exchange_seconds = s.amax_exchange_seconds;
  out->quantize_buffer_bytes = s.quantize_buffer_bytes;
  out->delta_pieces = s.delta_pieces;
  out->delta_full_pieces =
      s.delta_full_no_base + s.delta_full_receiver_version + s.delta_full_not_smaller;
  out->delta_stream_bytes = s.delta_stream_bytes;
  out->delta_plain_bytes = s.delta_plain_bytes;
  out->delta_shadow_bytes = s.delta_shadow_bytes;
  out->deltas_applied = s.deltas_applied;
  out->cuda_buffers_registered = s.cuda_buffers_registered;
  out->cuda_buffers_staged = s.cuda_buffers_staged;
  out->bytes_staged_to_host = s.bytes_staged_to_host;
  out->bytes_staged_to_device = s.bytes_staged_to_device;
  out->delta_device_shadow_bytes = s.delta_device_shadow_bytes;
  out->delta_pinned_bytes = s.delta_pinned_bytes;
  out->stage_ring_bytes = s.stage_ring_bytes;
  out->stage_copy_bytes = s.stage_copy_bytes;
  out->stage_landing_bytes = s.stage_landing_bytes;
  out->stage_landing_rounds = s.stage_landing_rounds;
  out->stage_ring_batches = s.stage_ring_batches;
  out->bytes_ring_packed = s.bytes_ring_packed;
  out->stage_round_scatters = s.stage_round_scatters;
  out->local_copy_launches = s.local_copy_launches;
  out->stage_bounce_bytes = s.stage_bounce_bytes;
  out->bounced_data_messages = s.bounced_data_messages;
  out->bounce_waits = s.bounce_waits;
  out->landing_area_bytes = s.landing_area_bytes;
  out->send_scratch_bytes = s.send_scratch_bytes;
  out->delta_relay_early_segments = s.delta_relay_early_segments;
  out->relay_early_bytes = s.relay_early_bytes;
  return RESHARD_OK;
}

reshard_status_t reshard_handle_stats_sized(const reshard_handle_t* handle, reshard_stats_t* out,
                                            size_t out_size) {
  if (handle == nullptr || out == nullptr) {
    return Invalid("reshard_handle_stats_sized: handle and out must not be NULL");
  }
  reshard_stats_t all;
  std::memset(&all, 0, sizeof(all));
  const reshard_status_t status = reshard_handle_stats(handle, &all);
  if (status == RESHARD_OK) std::memcpy(out, &all, std::min(out_size, sizeof(all)));
  return status;
}

void reshard_handle_destroy(reshard_handle_t* handle) { delete handle; }

}  // extern "C"
