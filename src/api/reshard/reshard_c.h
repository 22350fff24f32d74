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

#include <stddef.h>
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

/* Element types, mirroring reshard::DType (values are stable: new ones are appended). */
typedef enum reshard_dtype {
  RESHARD_DTYPE_BOOL = 0,
  RESHARD_DTYPE_U8 = 1,
  RESHARD_DTYPE_I8 = 2,
  RESHARD_DTYPE_I16 = 3,
  RESHARD_DTYPE_I32 = 4,
  RESHARD_DTYPE_I64 = 5,
  RESHARD_DTYPE_FP8E4M3 = 6,
  RESHARD_DTYPE_FP8E5M2 = 7,
  RESHARD_DTYPE_FP16 = 8,
  RESHARD_DTYPE_BF16 = 9,
  RESHARD_DTYPE_FP32 = 10,
  RESHARD_DTYPE_FP64 = 11
} reshard_dtype_t;

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
  int64_t data_messages;      /* data active messages posted (the delivery used over tcp) */
  int64_t single_copy_writes; /* process_vm_writev calls (same-host peers, one copy) */
  int64_t mapped_copies;      /* runs memcpy'd into a same-host peer's mapped HostBuffer */
  /* Quantized destinations: reshard::Stats' fields of the same names. */
  double quantize_seconds;
  double amax_exchange_seconds;
  int64_t quantize_buffer_bytes;
  /* Delta refits (reshard_handle_options_t.delta; reshard::Stats has the details): pieces sent
   * as deltas, as plain pieces (any reason), the bytes sent for them against their plain
   * bytes, the shadow kept (host and device memory together), deltas applied here. */
  int64_t delta_pieces;
  int64_t delta_full_pieces;
  int64_t delta_stream_bytes;
  int64_t delta_plain_bytes;
  int64_t delta_shadow_bytes;
  int64_t deltas_applied;
  /* CUDA memory: reshard::Stats' fields of the same names (registered directly or staged). */
  int64_t cuda_buffers_registered;
  int64_t cuda_buffers_staged;
  int64_t bytes_staged_to_host;
  int64_t bytes_staged_to_device;
  /* The shadow's part in device memory, and the GPU encode pipeline's pinned host memory. */
  int64_t delta_device_shadow_bytes;
  int64_t delta_pinned_bytes;
  /* The staging ring of staged CUDA sources: its pinned bytes, this refit's pack launches and
   * the bytes they packed (reshard::Stats' fields of the same names). */
  int64_t stage_ring_bytes;
  int64_t stage_ring_batches;
  int64_t bytes_ring_packed;
  /* Pinned host copies of staged CUDA buffers, full size (reshard::Stats::stage_copy_bytes). */
  int64_t stage_copy_bytes;
  /* The landing rounds of CUDA destinations UCX cannot register: their pinned area and the
   * rounds copied out of it (reshard::Stats' fields of the same names). */
  int64_t stage_landing_bytes;
  int64_t stage_landing_rounds;
  /* Rounds scattered and local pieces copied by one kernel launch each (reshard::Stats' fields
   * of the same names). */
  int64_t stage_round_scatters;
  int64_t local_copy_launches;
  /* Data messages into CUDA memory: the pinned bounce area, the messages moved through it and
   * those that waited for a slot (reshard::Stats' fields of the same names). */
  int64_t stage_bounce_bytes;
  int64_t bounced_data_messages;
  int64_t bounce_waits;
  /* Host memory held for streams: the landing area and the send scratch (reshard::Stats' fields
   * of the same names). */
  int64_t landing_area_bytes;
  int64_t send_scratch_bytes;
  /* Delta relays' segments forwarded before their piece landed (reshard::Stats'). */
  int64_t delta_relay_early_segments;
  /* Plain relays' bytes forwarded before their piece landed (reshard::Stats'). */
  int64_t relay_early_bytes;
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
/* reshard::Communicator::FromEnvironment: the variables of reshard's launcher, torchrun, mpirun
 * or Slurm's srun, in the precedence of docs/configuration.md (RESHARD_* first). Under torchrun
 * rank 0 serves the store on MASTER_ADDR at MASTER_PORT + 1 (RESHARD_STORE_PORT). */
reshard_status_t reshard_comm_from_env(reshard_comm_t** out);
int32_t reshard_comm_rank(const reshard_comm_t* comm);
int32_t reshard_comm_world_size(const reshard_comm_t* comm);
/* This process's index among the ranks of its host when the launcher gave one (see
 * reshard::Communicator::local_rank: RESHARD_LOCAL_RANK, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
 * SLURM_LOCALID), e.g. to pick a CUDA device; -1 when it did not, for communicators not made by
 * reshard_comm_from_env, and for NULL. */
int32_t reshard_comm_local_rank(const reshard_comm_t* comm);
void reshard_comm_destroy(reshard_comm_t* comm);

/* ---- Store callbacks: the framework's own key-value store (torch.distributed's store, etcd,
 * a PMIx KV ...) as the rendezvous store (reshard::StoreCallbacks).
 *
 * Results. A callback reports what it read through a reshard_store_result_t the library owns:
 * it copies a value in with reshard_store_result_set_value (get) or adds one entry per key with
 * reshard_store_result_add_entry (list), and may attach a message to a failure with
 * reshard_store_result_set_error. The library copies everything it is given, so the callback
 * keeps ownership of its own memory (stack, malloc'd, a Python bytes object) and frees it when
 * it likes; the result object itself is valid only until the callback returns and must not be
 * kept or freed.
 *
 * Return codes. Each callback returns a reshard_status_t:
 *   RESHARD_OK                 done (get: a value was set on the result);
 *   RESHARD_DEADLINE_EXCEEDED  get only: the key did not appear within timeout_ms. The library
 *                              polls some keys with short timeouts and treats this code as "not
 *                              yet"; every other failure ends the operation that asked;
 *   RESHARD_UNAVAILABLE        the store cannot be reached;
 *   any other code             passed on as it is.
 * A failing call's message (reshard_store_result_set_error, else one naming the callback, the
 * code and the key) becomes part of the reshard_last_error() of the library call that made it.
 *
 * Keys are NUL-terminated printable ASCII. Values are binary (they may contain NUL): always a
 * pointer and a length in bytes.
 *
 * Threads: the library calls the callbacks only on threads that call into it (during
 * reshard_handle_create and reshard_handle_destroy, for the set-up exchange and the farewell
 * barrier), never on a thread of its own and never during execute, start or wait. Handles
 * created or destroyed concurrently on several threads make concurrent calls, so the callbacks
 * must be thread-safe unless the program calls the library from one thread only.
 *
 * Lifetime: `user` and the functions must stay valid until `release` is called (or, without
 * `release`, until the communicator and every handle created from it are destroyed). */
typedef struct reshard_store_result reshard_store_result_t;

typedef struct reshard_store_callbacks {
  void* user; /* passed as the first argument of every callback */
  /* Required. Sets key to the value_size bytes at value, replacing any previous value. */
  int32_t (*set)(void* user, const char* key, const void* value, int64_t value_size,
                 reshard_store_result_t* result);
  /* Required. Waits up to timeout_ms (>= 0; 0: look once without waiting) until key exists, then
   * gives its value through reshard_store_result_set_value and returns RESHARD_OK; returns
   * RESHARD_DEADLINE_EXCEEDED when the key did not appear in time. Must return within about
   * timeout_ms: the library's own deadlines rely on it. */
  int32_t (*get)(void* user, const char* key, int64_t timeout_ms, reshard_store_result_t* result);
  /* Optional (NULL): adds every key starting with prefix through reshard_store_result_add_entry
   * (any order; the library sorts), without waiting. The library itself never lists; tools that
   * inspect a store do, and get RESHARD_UNIMPLEMENTED without it. */
  int32_t (*list)(void* user, const char* prefix, reshard_store_result_t* result);
  /* Optional (NULL): removes key; RESHARD_OK when it was absent. Without it the keys of finished
   * barrier generations accumulate (a few bytes per rank and barrier). */
  int32_t (*delete_key)(void* user, const char* key, reshard_store_result_t* result);
  /* Optional (NULL): called exactly once, on some thread, when the library will make no more
   * calls with `user`: after the communicator and its last handle are destroyed, or before
   * reshard_comm_from_callbacks returns an error. Free `user` here. */
  void (*release)(void* user);
} reshard_store_callbacks_t;

/* Copies the value_size bytes at value into the result (a get's value; a later call replaces
 * it). value may be NULL when value_size is 0. */
reshard_status_t reshard_store_result_set_value(reshard_store_result_t* result, const void* value,
                                                int64_t value_size);
/* Adds one key and its value to a list's result (both copied). */
reshard_status_t reshard_store_result_add_entry(reshard_store_result_t* result, const char* key,
                                                const void* value, int64_t value_size);
/* Attaches a message (copied; one sentence, e.g. "etcd at 10.0.0.5:2379 refused the
 * connection") to the failure the callback is about to return. */
void reshard_store_result_set_error(reshard_store_result_t* result, const char* message);

/* A communicator over the callbacks (copied; the struct need not outlive the call). timeout_ms
 * (<= 0: 30 s) bounds the farewell barrier when handles are destroyed (at most 10 s), like
 * reshard_comm_connect's. RESHARD_INVALID_ARGUMENT when set or get is NULL or rank is outside
 * [0, world_size). */
reshard_status_t reshard_comm_from_callbacks(const reshard_store_callbacks_t* callbacks,
                                             int32_t rank, int32_t world_size, int64_t timeout_ms,
                                             reshard_comm_t** out);

/* Specs (JSON format of docs/api.md). */
reshard_status_t reshard_spec_from_json(const char* json, reshard_spec_t** out);
reshard_status_t reshard_spec_from_file(const char* path, reshard_spec_t** out);
int32_t reshard_spec_world_size(const reshard_spec_t* spec);
/* Number of buffers `rank` must provide; then each one's name (valid while the spec lives),
 * side and exact size. */
reshard_status_t reshard_spec_buffer_count(reshard_spec_t* spec, int32_t rank, int32_t* count);
reshard_status_t reshard_spec_buffer_info(reshard_spec_t* spec, int32_t rank, int32_t index,
                                          const char** name, int32_t* side, int64_t* bytes);

/* The part of one tensor a rank holds on one side (reshard::LocalTile): the global box
 * [lo, hi) of a tensor of global_shape, and where its elements sit in the rank's buffer named
 * `buffer`: element (i0, i1, ...) of the tile (i_k counted from lo[k]) is element
 * offset + sum(i_k * strides[k]) of the buffer, in units of the dtype. Strings and arrays belong
 * to the spec: valid until it is destroyed. */
typedef struct reshard_tile_info {
  const char* tensor;
  const char* buffer;
  int32_t side;             /* reshard_side_t */
  int32_t dtype;            /* reshard_dtype_t; quantized destinations: the FP8 type */
  const char* dtype_name;   /* the spec's spelling: "bf16", "fp8e4m3", ... */
  int32_t ndim;             /* entries in each array below (NULL arrays when 0) */
  const int64_t* global_shape;
  const int64_t* lo;
  const int64_t* hi;
  const int64_t* strides;   /* in elements, resolved (a contiguous tile's row-major strides) */
  int64_t offset;           /* in elements */
  int64_t num_elements;     /* product of hi - lo (0 for an empty tile of an uneven shard) */
  /* The name of the quantized tensor whose scales this tile holds (destinations, and sources
   * that already hold FP8: the tile's tensor is then "<that>.scale"); "" otherwise. */
  const char* scales_of;
} reshard_tile_info_t;

/* Number of tiles `rank` holds on `side` (every tensor that places a tile there, in spec
 * order, empty tiles of uneven shards included, then the scales of that side's quantized
 * tensors), then each one. Computed once per (rank, side) and kept with the spec. */
reshard_status_t reshard_spec_tile_count(reshard_spec_t* spec, int32_t rank, int32_t side,
                                         int32_t* count);
reshard_status_t reshard_spec_tile_info(reshard_spec_t* spec, int32_t rank, int32_t side,
                                        int32_t index, reshard_tile_info_t* out);
/* "bf16" for RESHARD_DTYPE_BF16 ...; NULL for a value that is no dtype. */
const char* reshard_dtype_name(int32_t dtype);
/* Bytes per element; 0 for a value that is no dtype. */
int32_t reshard_dtype_size(int32_t dtype);
void reshard_spec_destroy(reshard_spec_t* spec);

/* Refit handles: collective set-up over every rank of the spec. name may be NULL (default
 * naming, see reshard::HandleOptions). */
reshard_status_t reshard_handle_create(reshard_comm_t* comm, const reshard_spec_t* spec,
                                       const reshard_buffer_t* buffers, int32_t num_buffers,
                                       const char* name, int32_t schedule, reshard_handle_t** out);
reshard_status_t reshard_handle_execute(reshard_handle_t* handle, int64_t timeout_ms);
reshard_status_t reshard_handle_start(reshard_handle_t* handle);
reshard_status_t reshard_handle_wait(reshard_handle_t* handle, int64_t timeout_ms);
/* Stream-ordered refits (reshard::RefitHandle::StartOnStream and RecordCompletion; docs/api.md).
 * `stream` is a cudaStream_t of this process's current device; NULL is CUDA's legacy default
 * stream (torch's default stream), not "no stream" (that is reshard_handle_start).
 *
 * reshard_handle_start_on_stream: reshard_handle_start after the work queued on `stream` before
 * the call, without a host or device synchronise: nothing reads this rank's sources or writes
 * its destinations before that work is done; reshard_handle_wait starts the refit once it is
 * (its timeout covers that work). Returns RESHARD_FAILED_PRECONDITION (a refit is in flight or
 * failed without reset; reshard built without CUDA; no usable GPU) or RESHARD_INVALID_ARGUMENT
 * (the CUDA runtime refuses the stream): the refit did not start. When the stream's work fails
 * or outlasts the timeout, reshard_handle_wait returns RESHARD_INTERNAL or
 * RESHARD_DEADLINE_EXCEEDED and nothing was read or written.
 *
 * reshard_handle_record_completion: between a start and the end of its wait, makes `stream` wait
 * on the device until this rank's part of the refit is over: work queued on it afterwards runs
 * once every piece landed, with no host wait for the stream (the host still drives the refit in
 * reshard_handle_wait). A refit that fails, is reset or whose handle is destroyed releases the
 * stream too; the failure is what reshard_handle_wait returns, and the destinations must not be
 * used then. Returns RESHARD_FAILED_PRECONDITION (no refit in flight; no CUDA, usable GPU or
 * driver stream memory operations) or RESHARD_INVALID_ARGUMENT (the driver refuses the stream);
 * the refit in flight is unaffected. */
reshard_status_t reshard_handle_start_on_stream(reshard_handle_t* handle, void* stream);
reshard_status_t reshard_handle_record_completion(reshard_handle_t* handle, void* stream);
/* reshard_handle_create with a bound on the collective set-up (<= 0: 60 s, the default of
 * reshard_handle_create and reshard::HandleOptions::setup_timeout). A rank that does not take
 * part in time makes the others fail with RESHARD_DEADLINE_EXCEEDED. */
reshard_status_t reshard_handle_create_with_timeout(reshard_comm_t* comm,
                                                    const reshard_spec_t* spec,
                                                    const reshard_buffer_t* buffers,
                                                    int32_t num_buffers, const char* name,
                                                    int32_t schedule, int64_t setup_timeout_ms,
                                                    reshard_handle_t** out);
/* In place of reshard_handle_create on a rank that cannot take part (it found its own buffers
 * unusable before calling create): takes the handle number create would have taken and tells
 * the other ranks of the spec, whose create fails at once ("rank R failed before agreeing on the
 * plan fingerprint: <message>") instead of at their set-up deadline (reshard::RefitHandle::
 * Abandon). `name` as given to create (NULL: the next handle number); `code` the failure, a
 * reshard_status_t value (RESHARD_OK, or a value that is no status code: RESHARD_UNKNOWN; an
 * int32_t, so a caller may pass any code it has). Returns that code, with `message` as the
 * last error. reshard_handle_create does this itself for the buffers it refuses. */
reshard_status_t reshard_handle_abandon(reshard_comm_t* comm, const reshard_spec_t* spec,
                                        const char* name, int32_t code,
                                        const char* message);
/* Every option of a handle (reshard::HandleOptions). Fields are only ever appended; zero a new
 * struct (memset) before setting the fields you use, and pass its size. */
typedef struct reshard_handle_options {
  const char* name;         /* NULL or "": default naming */
  int32_t schedule;         /* reshard_schedule_t */
  int64_t setup_timeout_ms; /* <= 0: 60 s */
  int32_t delta;            /* nonzero: delta refits (docs/delta.md) */
  int64_t stage_ring_bytes; /* <= 0: 256 MiB (reshard::HandleOptions::stage_ring_bytes) */
  /* <= 0: 256 MiB (reshard::HandleOptions::stage_landing_bytes) */
  int64_t stage_landing_bytes;
  int64_t stage_round_bytes; /* <= 0: 8 MiB (reshard::HandleOptions::stage_round_bytes) */
} reshard_handle_options_t;
/* reshard_handle_create with options; `options_size` is sizeof(reshard_handle_options_t) as
 * the caller compiled it (fields beyond it take their defaults). */
reshard_status_t reshard_handle_create_with_options(reshard_comm_t* comm,
                                                    const reshard_spec_t* spec,
                                                    const reshard_buffer_t* buffers,
                                                    int32_t num_buffers,
                                                    const reshard_handle_options_t* options,
                                                    size_t options_size, reshard_handle_t** out);
void reshard_handle_reset(reshard_handle_t* handle);
reshard_status_t reshard_handle_stats(const reshard_handle_t* handle, reshard_stats_t* out);
/* The same for a caller compiled against any version of this header: fills the first
 * `out_size` bytes of `out`, sizeof(reshard_stats_t) as the caller compiled it (fields are only
 * ever appended, so an older caller gets the fields it knows and nothing is written past its
 * struct). reshard_handle_stats writes this header's whole struct. */
reshard_status_t reshard_handle_stats_sized(const reshard_handle_t* handle, reshard_stats_t* out,
                                            size_t out_size);
void reshard_handle_destroy(reshard_handle_t* handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RESHARD_RESHARD_C_H_ */
