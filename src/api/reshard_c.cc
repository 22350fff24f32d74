#include "reshard/reshard_c.h"

#include <string>
#include <utility>
#include <vector>

#include "reshard/reshard.h"

struct reshard_comm {
  reshard::Communicator comm;
};
struct reshard_spec {
  reshard::RefitSpec spec;
  // Buffer requirements per rank asked so far (names must stay valid while the spec lives).
  std::vector<std::pair<int32_t, std::vector<reshard::BufferRequirement>>> requirements;
};
struct reshard_handle {
  reshard::RefitHandle handle;
};

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
int32_t reshard_comm_world_size(const reshard_comm_t* comm) {
  return comm ? comm->comm.world_size() : -1;
}
void reshard_comm_destroy(reshard_comm_t* comm) { delete comm; }

reshard_status_t reshard_spec_from_json(const char* json, reshard_spec_t** out) {
  if (json == nullptr || out == nullptr) {
    return Invalid("reshard_spec_from_json: json and out must not be NULL");
  }
  auto spec = reshard::RefitSpec::FromJson(json);
  if (!spec.ok()) return Report(spec.status());
  *out = new reshard_spec{std::move(spec).value(), {}};
  return RESHARD_OK;
}

reshard_status_t reshard_spec_from_file(const char* path, reshard_spec_t** out) {
  if (path == nullptr || out == nullptr) {
    return Invalid("reshard_spec_from_file: path and out must not be NULL");
  }
  auto spec = reshard::RefitSpec::FromFile(path);
  if (!spec.ok()) return Report(spec.status());
  *out = new reshard_spec{std::move(spec).value(), {}};
  return RESHARD_OK;
}

int32_t reshard_spec_world_size(const reshard_spec_t* spec) {
  return spec ? spec->spec.WorldSize() : -1;
}

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

void reshard_spec_destroy(reshard_spec_t* spec) { delete spec; }

reshard_status_t reshard_handle_create(reshard_comm_t* comm, const reshard_spec_t* spec,
                                       const reshard_buffer_t* buffers, int32_t num_buffers,
                                       const char* name, int32_t schedule, reshard_handle_t** out) {
  if (comm == nullptr || spec == nullptr || out == nullptr ||
      (num_buffers > 0 && buffers == nullptr) || num_buffers < 0) {
    return Invalid("reshard_handle_create: comm, spec, out (and buffers) must not be NULL");
  }
  reshard::LocalBuffers local;
  for (int32_t i = 0; i < num_buffers; ++i) {
    const reshard_buffer_t& b = buffers[i];
    if (b.name == nullptr) return Invalid("reshard_handle_create: a buffer has no name");
    if (b.side != RESHARD_SOURCE && b.side != RESHARD_DESTINATION) {
      return Invalid("reshard_handle_create: a buffer's side is neither source nor destination");
    }
    if (b.memory_kind != RESHARD_MEMORY_HOST && b.memory_kind != RESHARD_MEMORY_CUDA) {
      return Invalid("reshard_handle_create: a buffer's memory kind is neither host nor cuda");
    }
    local.Add(static_cast<reshard::Side>(b.side), b.name,
              reshard::Buffer{b.data, b.bytes, static_cast<reshard::MemoryKind>(b.memory_kind)});
  }
  reshard::HandleOptions options;
  if (name != nullptr) options.name = name;
  options.schedule = schedule == RESHARD_SCHEDULE_POINT_TO_POINT ? reshard::Schedule::kPointToPoint
                                                                 : reshard::Schedule::kDomainAware;
  auto handle = reshard::RefitHandle::Create(comm->comm, spec->spec, std::move(local), options);
  if (!handle.ok()) return Report(handle.status());
  *out = new reshard_handle{std::move(handle).value()};
  return RESHARD_OK;
}

reshard_status_t reshard_handle_execute(reshard_handle_t* handle, int64_t timeout_ms) {
  if (handle == nullptr) return Invalid("reshard_handle_execute: handle is NULL");
  return Report(handle->handle.Execute(absl::Now() + Timeout(timeout_ms)));
}
reshard_status_t reshard_handle_start(reshard_handle_t* handle) {
  if (handle == nullptr) return Invalid("reshard_handle_start: handle is NULL");
  return Report(handle->handle.Start());
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
  return RESHARD_OK;
}

void reshard_handle_destroy(reshard_handle_t* handle) { delete handle; }

}  // extern "C"
