/* The reshard C API, for FFI (Python ctypes, Rust, ...). Mirrors reshard/reshard.h.
 *
 * Objects are opaque handles created by *_create / *_from_* functions and released with the
 * matching *_destroy (NULL is accepted and ignored). A spec may be destroyed once handles are
 * created from it; a communicator must outlive nothing (handles keep what they need alive);
 * buffers must outlive the refit handle that uses them.
 *
 * Every fallible function returns a reshard_status_t (RESHARD_OK == 0). On failure the message
 * is kept per thread and returned by reshard_last_error() until the next failing call on that
 * thread. Codes equal absl::StatusCode values.
 *
 * Thread safety: communicators are thread-safe; a spec or a refit handle is used by one thread at
 * a time. Blocking calls take a timeout in milliseconds.
 */
#ifndef RESHARD_RESHARD_C_H_
#define RESHARD_RESHARD_C_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum reshard_status {
  RESHARD_OK = 0,
  RESHARD_CANCELLED = 1,
  RESHARD_UNKNOWN = 2,
  RESHARD_INVALID_ARGUMENT = 3,  /* bad spec, buffer missing or of the wrong size */
  RESHARD_DEADLINE_EXCEEDED = 4, /* a timeout passed */
  RESHARD_NOT_FOUND = 5,
  RESHARD_ALREADY_EXISTS = 6,
  RESHARD_PERMISSION_DENIED = 7, /* wrong store token */
  RESHARD_RESOURCE_EXHAUSTED = 8,
  RESHARD_FAILED_PRECONDITION = 9, /* refit after a failure without reset; spec mismatch */
  RESHARD_ABORTED = 10,
  RESHARD_OUT_OF_RANGE = 11,
  RESHARD_UNIMPLEMENTED = 12,
  RESHARD_INTERNAL = 13,
  RESHARD_UNAVAILABLE = 14, /* a peer or the store is gone */
  RESHARD_DATA_LOSS = 15,
  RESHARD_UNAUTHENTICATED = 16
} reshard_status_t;

typedef enum reshard_side { RESHARD_SOURCE = 0, RESHARD_DESTINATION = 1 } reshard_side_t;
typedef enum reshard_memory_kind {
  RESHARD_MEMORY_HOST = 0,
  RESHARD_MEMORY_CUDA = 1
} reshard_memory_kind_t;
typedef enum reshard_schedule {
  RESHARD_SCHEDULE_DOMAIN_AWARE = 0,
  RESHARD_SCHEDULE_POINT_TO_POINT = 1
} reshard_schedule_t;

typedef struct reshard_comm reshard_comm_t;
typedef struct reshard_spec reshard_spec_t;
typedef struct reshard_handle reshard_handle_t;

/* A buffer of this rank, named as in the spec (buffer name, or the tensor name). */
typedef struct reshard_buffer {
  const char* name;
  int32_t side; /* reshard_side_t */
  void* data;
  int64_t bytes;
  int32_t memory_kind; /* reshard_memory_kind_t */
} reshard_buffer_t;

/* Figures of the last refit (see reshard::Stats). */
typedef struct reshard_stats {
  uint64_t epoch;
  int64_t bytes_network_sent;
  int64_t bytes_network_received;
  int64_t bytes_local;
  int64_t pieces_received;
  int64_t pieces_expected;
  int64_t puts; /* one-sided puts posted (ucp_put_nbx) */
  int64_t registrations_this_refit;
  double start_seconds;
  double wait_seconds;
  double total_seconds;
  int64_t data_messages; /* data active messages posted (the delivery used over tcp) */
  int64_t single_copy_writes; /* process_vm_writev calls (same-host peers, one copy) */
  int64_t mapped_copies;      /* runs memcpy'd into a same-host peer's mapped HostBuffer */
} reshard_stats_t;

/* The message of the last failing call on this thread ("" when none). Valid until the next
 * failing call on this thread. */
const char* reshard_last_error(void);
/* "0.1.0" */
const char* reshard_version(void);

/* Communicators. timeout_ms <= 0 uses the default (30 s). serve_store: rank 0 serves the store
 * on the address's port. */
reshard_status_t reshard_comm_connect(const char* store_address, const char* token, int32_t rank,
                                      int32_t world_size, int32_t serve_store, int64_t timeout_ms,
                                      reshard_comm_t** out);
reshard_status_t reshard_comm_from_env(reshard_comm_t** out);
int32_t reshard_comm_rank(const reshard_comm_t* comm);
int32_t reshard_comm_world_size(const reshard_comm_t* comm);
void reshard_comm_destroy(reshard_comm_t* comm);

/* Specs (JSON format of docs/api.md). */
reshard_status_t reshard_spec_from_json(const char* json, reshard_spec_t** out);
reshard_status_t reshard_spec_from_file(const char* path, reshard_spec_t** out);
int32_t reshard_spec_world_size(const reshard_spec_t* spec);
/* Number of buffers `rank` must provide; then each one's name (valid while the spec lives),
 * side and exact size. */
reshard_status_t reshard_spec_buffer_count(reshard_spec_t* spec, int32_t rank, int32_t* count);
reshard_status_t reshard_spec_buffer_info(reshard_spec_t* spec, int32_t rank, int32_t index,
                                          const char** name, int32_t* side, int64_t* bytes);
void reshard_spec_destroy(reshard_spec_t* spec);

/* Refit handles: collective set-up over every rank of the spec. name may be NULL (default
 * naming, see reshard::HandleOptions). */
reshard_status_t reshard_handle_create(reshard_comm_t* comm, const reshard_spec_t* spec,
                                       const reshard_buffer_t* buffers, int32_t num_buffers,
                                       const char* name, int32_t schedule, reshard_handle_t** out);
reshard_status_t reshard_handle_execute(reshard_handle_t* handle, int64_t timeout_ms);
reshard_status_t reshard_handle_start(reshard_handle_t* handle);
reshard_status_t reshard_handle_wait(reshard_handle_t* handle, int64_t timeout_ms);
void reshard_handle_reset(reshard_handle_t* handle);
reshard_status_t reshard_handle_stats(const reshard_handle_t* handle, reshard_stats_t* out);
void reshard_handle_destroy(reshard_handle_t* handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RESHARD_RESHARD_C_H_ */
