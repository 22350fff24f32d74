/* The C API from C (compiled as C, not C++): store callbacks and per-rank tile lists.
 *
 * The store is the test's own: a directory of files, one per key (name: the key in hex), written
 * to a temporary file and renamed so a reader never sees half a value. Three forked ranks build
 * a communicator over it with reshard_comm_from_callbacks, list their buffers and tiles through
 * reshard_spec_buffer_* and reshard_spec_tile_*, create a handle with delta refits through
 * reshard_handle_create_with_options, fill their source tiles and verify every destination
 * element of three refits (rank 0's stats: every piece plain, as every element changes). Then, in
 * this process: a set callback that fails with a message must bring that message to
 * reshard_last_error(); a get that times out (a rank that never comes) must give
 * RESHARD_DEADLINE_EXCEEDED within the set-up deadline; `release` runs exactly once, also when
 * reshard_comm_from_callbacks fails.
 *
 * Prints one line per check that fails and exits 1; 0 when all pass.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "reshard/reshard_c.h"

static int failures = 0;

#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "[pid %d] %s:%d: CHECK(%s) failed: ", (int)getpid(), __FILE__, \
              __LINE__, #cond);                                                      \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, "\n");                                                         \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

static int64_t NowMs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void SleepMs(int64_t ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- The test's store: a directory of files. ---- */

typedef struct FileStore {
  char dir[256];
  const char* fail_set_message; /* non-NULL: set fails with RESHARD_UNAVAILABLE and this */
  int64_t largest_get_timeout_ms;
  int gets_timed_out;
  int releases;
  unsigned temp_counter;
} FileStore;

static void PathOf(const FileStore* s, const char* key, char* path, size_t size) {
  static const char hex[] = "0123456789abcdef";
  size_t n = (size_t)snprintf(path, size, "%s/", s->dir);
  for (const unsigned char* k = (const unsigned char*)key; *k != '\0' && n + 3 < size; ++k) {
    path[n++] = hex[*k >> 4];
    path[n++] = hex[*k & 15];
  }
  path[n] = '\0';
}

/* The whole file at `path` in a malloc'd buffer (*size bytes); NULL when it does not exist. */
static char* ReadFile(const char* path, int64_t* size) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return NULL;
  }
  char* data = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
  int64_t got = 0;
  while (got < st.st_size) {
    ssize_t r = read(fd, data + got, (size_t)(st.st_size - got));
    if (r <= 0) break;
    got += r;
  }
  close(fd);
  *size = got;
  return data;
}

static int32_t StoreSet(void* user, const char* key, const void* value, int64_t value_size,
                        reshard_store_result_t* result) {
  FileStore* s = user;
  if (s->fail_set_message != NULL) {
    reshard_store_result_set_error(result, s->fail_set_message);
    return RESHARD_UNAVAILABLE;
  }
  char path[1024], temp[1024];
  PathOf(s, key, path, sizeof(path));
  snprintf(temp, sizeof(temp), "%s/.tmp-%d-%u", s->dir, (int)getpid(), s->temp_counter++);
  int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    reshard_store_result_set_error(result, strerror(errno));
    return RESHARD_UNAVAILABLE;
  }
  const char* p = value;
  int64_t left = value_size;
  while (left > 0) {
    ssize_t w = write(fd, p, (size_t)left);
    if (w <= 0) break;
    p += w;
    left -= w;
  }
  close(fd);
  if (left != 0 || rename(temp, path) != 0) {
    reshard_store_result_set_error(result, "the test store could not write a key file");
    return RESHARD_UNAVAILABLE;
  }
  return RESHARD_OK;
}

static int32_t StoreGet(void* user, const char* key, int64_t timeout_ms,
                        reshard_store_result_t* result) {
  FileStore* s = user;
  if (timeout_ms > s->largest_get_timeout_ms) s->largest_get_timeout_ms = timeout_ms;
  char path[1024];
  PathOf(s, key, path, sizeof(path));
  const int64_t deadline = NowMs() + timeout_ms;
  for (;;) {
    int64_t size = 0;
    char* data = ReadFile(path, &size);
    if (data != NULL) {
      reshard_status_t st = reshard_store_result_set_value(result, data, size);
      free(data); /* The library copied it. */
      return st;
    }
    if (NowMs() >= deadline) {
      ++s->gets_timed_out;
      return RESHARD_DEADLINE_EXCEEDED;
    }
    SleepMs(1);
  }
}

static int32_t StoreList(void* user, const char* prefix, reshard_store_result_t* result) {
  FileStore* s = user;
  DIR* d = opendir(s->dir);
  if (d == NULL) return RESHARD_UNAVAILABLE;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char key[512];
    size_t n = 0;
    for (const char* h = e->d_name; h[0] != '\0' && h[1] != '\0' && n + 1 < sizeof(key); h += 2) {
      unsigned v = 0;
      sscanf(h, "%2x", &v);
      key[n++] = (char)v;
    }
    key[n] = '\0';
    if (strncmp(key, prefix, strlen(prefix)) != 0) continue;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", s->dir, e->d_name);
    int64_t size = 0;
    char* data = ReadFile(path, &size);
    if (data != NULL) {
      reshard_store_result_add_entry(result, key, data, size);
      free(data);
    }
  }
  closedir(d);
  return RESHARD_OK;
}

static int32_t StoreDelete(void* user, const char* key, reshard_store_result_t* result) {
  char path[1024];
  PathOf(user, key, path, sizeof(path));
  return unlink(path) == 0 || errno == ENOENT ? RESHARD_OK : RESHARD_UNAVAILABLE;
}

static void StoreRelease(void* user) { ++((FileStore*)user)->releases; }

static reshard_store_callbacks_t CallbacksOf(FileStore* s) {
  reshard_store_callbacks_t cb;
  memset(&cb, 0, sizeof(cb));
  cb.user = s;
  cb.set = StoreSet;
  cb.get = StoreGet;
  cb.list = StoreList;
  cb.delete_key = StoreDelete;
  cb.release = StoreRelease;
  return cb;
}

static void NewStore(FileStore* s, const char* tag) {
  memset(s, 0, sizeof(*s));
  const char* tmp = getenv("TMPDIR");
  snprintf(s->dir, sizeof(s->dir), "%s/reshard-c-store-%s-XXXXXX", tmp ? tmp : "/tmp", tag);
  if (mkdtemp(s->dir) == NULL) {
    fprintf(stderr, "mkdtemp %s: %s\n", s->dir, strerror(errno));
    exit(2);
  }
}

static void RemoveStore(const FileStore* s) {
  DIR* d = opendir(s->dir);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", s->dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(s->dir);
}

/* ---- The refit across forked ranks. ---- */

/* Rows of "w" over ranks {0, 1} -> columns over {1, 2}; "q" and "k" from rank 0 into one fused
 * buffer "qk" per destination rank, rows interleaved (q's row i at 6 i, k's at 6 i + 3). */
static const char kSpec[] =
    "{\"tensors\": ["
    " {\"name\": \"w\", \"dtype\": \"i32\", \"shape\": [8, 6],"
    "  \"src\": {\"mesh\": [0, 1], \"placements\": [\"S(0)\"]},"
    "  \"dst\": {\"mesh\": [1, 2], \"placements\": [\"S(1)\"]}},"
    " {\"name\": \"q\", \"dtype\": \"i32\", \"shape\": [4, 3],"
    "  \"src\": {\"mesh\": [0], \"placements\": [\"R\"]},"
    "  \"dst\": {\"mesh\": [1, 2], \"placements\": [\"S(0)\"], \"buffer\": \"qk\","
    "           \"view\": {\"offset\": 0, \"strides\": [6, 1]}}},"
    " {\"name\": \"k\", \"dtype\": \"i32\", \"shape\": [4, 3],"
    "  \"src\": {\"mesh\": [0], \"placements\": [\"R\"]},"
    "  \"dst\": {\"mesh\": [1, 2], \"placements\": [\"S(0)\"], \"buffer\": \"qk\","
    "           \"view\": {\"offset\": 3, \"strides\": [6, 1]}}}]}";
enum { kWorld = 3, kSteps = 3, kMaxBuffers = 8 };

/* The value of global element `index` of tensor number `tensor` in refit `step`. */
static int32_t Expected(int tensor, int step, int64_t index) {
  return (int32_t)(tensor * 1000000 + step * 10000 + index);
}

static int TensorNumber(const char* name) {
  return strcmp(name, "w") == 0 ? 1 : strcmp(name, "q") == 0 ? 2 : 3;
}

/* Calls `visit` for every element of the tile: its index in the buffer and its global index. */
typedef void (*Visit)(int32_t* buffer, int64_t at, int64_t global, int tensor, int step);
static void ForEachElement(const reshard_tile_info_t* t, int32_t* buffer, int step, Visit visit) {
  if (t->num_elements == 0) return;
  int64_t i[8];
  for (int d = 0; d < t->ndim; ++d) i[d] = t->lo[d];
  for (;;) {
    int64_t at = t->offset, global = 0;
    for (int d = 0; d < t->ndim; ++d) {
      at += (i[d] - t->lo[d]) * t->strides[d];
      global = global * t->global_shape[d] + i[d];
    }
    visit(buffer, at, global, TensorNumber(t->tensor), step);
    int d = t->ndim;
    while (d > 0 && ++i[d - 1] == t->hi[d - 1]) {
      i[d - 1] = t->lo[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

static void Fill(int32_t* buffer, int64_t at, int64_t global, int tensor, int step) {
  buffer[at] = Expected(tensor, step, global);
}

static int64_t wrong_elements = 0;
static void Verify(int32_t* buffer, int64_t at, int64_t global, int tensor, int step) {
  if (buffer[at] != Expected(tensor, step, global)) {
    if (wrong_elements++ < 5) {
      fprintf(stderr, "tensor %d element %lld, step %d: got %d, expected %d\n", tensor,
              (long long)global, step, buffer[at], Expected(tensor, step, global));
    }
  }
}

/* One rank's life; returns its exit code. */
static int RunRank(FileStore* store, int32_t rank) {
  reshard_store_callbacks_t cb = CallbacksOf(store);
  reshard_comm_t* comm = NULL;
  reshard_status_t st = reshard_comm_from_callbacks(&cb, rank, kWorld, 20000, &comm);
  CHECK(st == RESHARD_OK, "reshard_comm_from_callbacks: %s", reshard_last_error());
  if (st != RESHARD_OK) return 1;
  CHECK(reshard_comm_rank(comm) == rank, "rank %d", reshard_comm_rank(comm));
  CHECK(reshard_comm_local_rank(comm) == -1, "no launcher gave a local rank");
  reshard_spec_t* spec = NULL;
  st = reshard_spec_from_json(kSpec, &spec);
  CHECK(st == RESHARD_OK, "reshard_spec_from_json: %s", reshard_last_error());
  if (st != RESHARD_OK) return 1;

  int32_t count = 0;
  CHECK(reshard_spec_buffer_count(spec, rank, &count) == RESHARD_OK, "%s", reshard_last_error());
  reshard_buffer_t buffers[kMaxBuffers];
  int32_t* data[kMaxBuffers];
  for (int32_t b = 0; b < count && b < kMaxBuffers; ++b) {
    const char* name = NULL;
    int32_t side = 0;
    int64_t bytes = 0;
    CHECK(reshard_spec_buffer_info(spec, rank, b, &name, &side, &bytes) == RESHARD_OK, "%s",
          reshard_last_error());
    data[b] = malloc((size_t)bytes);
    memset(data[b], 0xff, (size_t)bytes);
    reshard_buffer_t buffer = {name, side, data[b], bytes, RESHARD_MEMORY_HOST};
    buffers[b] = buffer;
  }
  /* Delta refits through the options struct (docs/delta.md); every element changes each step,
   * so every network piece travels plain, and the destinations still verify exactly. */
  reshard_handle_t* handle = NULL;
  reshard_handle_options_t options;
  memset(&options, 0, sizeof(options));
  options.schedule = RESHARD_SCHEDULE_DOMAIN_AWARE;
  options.delta = 1;
  options.stage_round_bytes = 1 << 16; /* Host buffers: passes through, no round area. */
  st = reshard_handle_create_with_options(comm, spec, buffers, count, &options, sizeof(options),
                                          &handle);
  CHECK(st == RESHARD_OK, "reshard_handle_create_with_options: %s", reshard_last_error());
  if (st != RESHARD_OK) return 1;

  for (int step = 1; step <= kSteps; ++step) {
    for (int32_t side = RESHARD_SOURCE; side <= RESHARD_DESTINATION; ++side) {
      if (side == RESHARD_DESTINATION) {
        st = reshard_handle_execute(handle, 20000);
        CHECK(st == RESHARD_OK, "refit %d: %s", step, reshard_last_error());
      }
      int32_t tiles = 0;
      CHECK(reshard_spec_tile_count(spec, rank, side, &tiles) == RESHARD_OK, "%s",
            reshard_last_error());
      for (int32_t i = 0; i < tiles; ++i) {
        reshard_tile_info_t t;
        CHECK(reshard_spec_tile_info(spec, rank, side, i, &t) == RESHARD_OK, "%s",
              reshard_last_error());
        CHECK(t.dtype == RESHARD_DTYPE_I32 && strcmp(t.dtype_name, "i32") == 0, "dtype %d %s",
              t.dtype, t.dtype_name);
        CHECK(t.side == side, "side %d", t.side);
        int32_t* buffer = NULL;
        for (int32_t b = 0; b < count; ++b) {
          if (buffers[b].side == side && strcmp(buffers[b].name, t.buffer) == 0) buffer = data[b];
        }
        CHECK(buffer != NULL, "tile %s names buffer %s, which is not listed", t.tensor, t.buffer);
        if (buffer == NULL) continue;
        ForEachElement(&t, buffer, step, side == RESHARD_SOURCE ? Fill : Verify);
      }
    }
  }
  CHECK(wrong_elements == 0, "%lld destination elements differ", (long long)wrong_elements);
  reshard_stats_t stats;
  CHECK(reshard_handle_stats(handle, &stats) == RESHARD_OK, "%s", reshard_last_error());
  if (rank == 0) { /* It sends w and q over the network. */
    CHECK(stats.delta_pieces == 0 && stats.delta_full_pieces > 0 && stats.delta_plain_bytes > 0 &&
              stats.delta_stream_bytes > stats.delta_plain_bytes && stats.delta_shadow_bytes > 0,
          "delta stats: %lld deltas, %lld plain, %lld of %lld bytes, %lld shadow bytes",
          (long long)stats.delta_pieces, (long long)stats.delta_full_pieces,
          (long long)stats.delta_stream_bytes, (long long)stats.delta_plain_bytes,
          (long long)stats.delta_shadow_bytes);
  }
  reshard_handle_destroy(handle);
  reshard_spec_destroy(spec);
  reshard_comm_destroy(comm);
  for (int32_t b = 0; b < count; ++b) free(data[b]);
  return failures == 0 ? 0 : 1;
}

static void TestRefitAcrossForkedRanks(void) {
  FileStore store;
  NewStore(&store, "refit");
  pid_t pids[kWorld];
  for (int32_t r = 0; r < kWorld; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(90); /* A rank that hangs dies instead of holding ctest until its timeout. */
      _exit(RunRank(&store, r));
    }
  }
  const int64_t deadline = NowMs() + 100000;
  int left = kWorld;
  while (left > 0) {
    for (int32_t r = 0; r < kWorld; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d ended with status %d", r,
              status);
        pids[r] = 0;
        --left;
      }
    }
    if (left > 0 && NowMs() > deadline) {
      for (int32_t r = 0; r < kWorld; ++r) {
        if (pids[r] > 0) {
          CHECK(0, "rank %d still runs at the deadline", r);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          pids[r] = 0;
          --left;
        }
      }
    }
    SleepMs(10);
  }
  RemoveStore(&store);
}

/* ---- Error paths, in this process. ---- */

static const char kOneRank[] =
    "{\"tensors\": [{\"name\": \"w\", \"dtype\": \"i32\", \"shape\": [4, 6],"
    " \"src\": {\"mesh\": [0], \"placements\": [\"R\"]},"
    " \"dst\": {\"mesh\": [1], \"placements\": [\"R\"]}}]}";

static void TestCallbackErrorReachesLastError(void) {
  FileStore store;
  NewStore(&store, "error");
  store.fail_set_message = "the test store's disk is full (injected)";
  reshard_store_callbacks_t cb = CallbacksOf(&store);
  reshard_comm_t* comm = NULL;
  reshard_status_t st = reshard_comm_from_callbacks(&cb, 0, 2, 5000, &comm);
  CHECK(st == RESHARD_OK, "%s", reshard_last_error());
  reshard_spec_t* spec = NULL;
  CHECK(reshard_spec_from_json(kOneRank, &spec) == RESHARD_OK, "%s", reshard_last_error());
  int32_t src[24];
  reshard_buffer_t buffer = {"w", RESHARD_SOURCE, src, sizeof(src), RESHARD_MEMORY_HOST};
  reshard_handle_t* handle = NULL;
  st = reshard_handle_create_with_timeout(comm, spec, &buffer, 1, NULL, 0, 5000, &handle);
  CHECK(st == RESHARD_UNAVAILABLE, "create gave %d: %s", st, reshard_last_error());
  CHECK(strstr(reshard_last_error(), "disk is full (injected)") != NULL, "last error: %s",
        reshard_last_error());
  CHECK(strstr(reshard_last_error(), "set callback") != NULL, "last error: %s",
        reshard_last_error());
  CHECK(handle == NULL, "no handle on failure");
  CHECK(store.releases == 0, "released while the communicator lives");
  reshard_spec_destroy(spec);
  reshard_comm_destroy(comm);
  CHECK(store.releases == 1, "released %d times", store.releases);
  RemoveStore(&store);
}

static void TestGetTimeoutIsDeadlineExceeded(void) {
  FileStore store;
  NewStore(&store, "timeout");
  reshard_store_callbacks_t cb = CallbacksOf(&store);
  reshard_comm_t* comm = NULL;
  CHECK(reshard_comm_from_callbacks(&cb, 0, 2, 5000, &comm) == RESHARD_OK, "%s",
        reshard_last_error());
  reshard_spec_t* spec = NULL;
  CHECK(reshard_spec_from_json(kOneRank, &spec) == RESHARD_OK, "%s", reshard_last_error());
  int32_t src[24];
  reshard_buffer_t buffer = {"w", RESHARD_SOURCE, src, sizeof(src), RESHARD_MEMORY_HOST};
  reshard_handle_t* handle = NULL;
  enum { kSetupMs = 1500 };
  const int64_t start = NowMs();
  /* Rank 1 never comes: rank 0's get of its keys must time out at the set-up deadline. */
  reshard_status_t st =
      reshard_handle_create_with_timeout(comm, spec, &buffer, 1, NULL, 0, kSetupMs, &handle);
  const int64_t took = NowMs() - start;
  CHECK(st == RESHARD_DEADLINE_EXCEEDED, "create gave %d: %s", st, reshard_last_error());
  CHECK(took >= kSetupMs - 50 && took < kSetupMs + 3000, "took %lld ms for a %d ms deadline",
        (long long)took, kSetupMs);
  CHECK(store.gets_timed_out > 0, "no get timed out");
  CHECK(store.largest_get_timeout_ms > 0 && store.largest_get_timeout_ms <= kSetupMs,
        "the library asked for a %lld ms wait within a %d ms deadline",
        (long long)store.largest_get_timeout_ms, kSetupMs);
  reshard_spec_destroy(spec);
  reshard_comm_destroy(comm);
  CHECK(store.releases == 1, "released %d times", store.releases);
  RemoveStore(&store);
}

static int32_t NeverCalledSet(void* user, const char* key, const void* value, int64_t size,
                              reshard_store_result_t* result) {
  return RESHARD_INTERNAL;
}

static void TestBadCallbacksAreReleasedAndNamed(void) {
  FileStore store;
  memset(&store, 0, sizeof(store));
  reshard_store_callbacks_t cb = CallbacksOf(&store);
  cb.get = NULL;
  reshard_comm_t* comm = NULL;
  CHECK(reshard_comm_from_callbacks(&cb, 0, 1, 0, &comm) == RESHARD_INVALID_ARGUMENT, "NULL get");
  CHECK(strstr(reshard_last_error(), "get callback is NULL") != NULL, "%s", reshard_last_error());
  CHECK(store.releases == 1, "released %d times after a failed create", store.releases);
  cb = CallbacksOf(&store);
  cb.set = NeverCalledSet;
  CHECK(reshard_comm_from_callbacks(&cb, 3, 2, 0, &comm) == RESHARD_INVALID_ARGUMENT,
        "rank 3 of 2");
  CHECK(strstr(reshard_last_error(), "rank 3") != NULL, "%s", reshard_last_error());
  CHECK(store.releases == 2, "released %d times after two failed creates", store.releases);
  /* list and delete are optional. */
  cb = CallbacksOf(&store);
  cb.list = NULL;
  cb.delete_key = NULL;
  cb.release = NULL;
  CHECK(reshard_comm_from_callbacks(&cb, 0, 1, 0, &comm) == RESHARD_OK, "%s",
        reshard_last_error());
  reshard_comm_destroy(comm);
}

/* A callback that hands the library hostile sizes: each is refused, nothing is copied. */
static int g_hostile_set_value = -1, g_hostile_add_entry = -1;
static int32_t HostileSet(void* user, const char* key, const void* value, int64_t size,
                          reshard_store_result_t* result) {
  g_hostile_set_value = reshard_store_result_set_value(result, "x", -1);
  g_hostile_add_entry = reshard_store_result_add_entry(result, "k", "x", INT64_MIN);
  reshard_store_result_set_error(result, "hostile sizes were refused");
  return RESHARD_INTERNAL;
}

static void TestHostileSizesAreRefused(void) {
  FileStore store;
  NewStore(&store, "hostile");
  reshard_store_callbacks_t cb = CallbacksOf(&store);
  cb.set = HostileSet;
  reshard_comm_t* comm = NULL;
  CHECK(reshard_comm_from_callbacks(&cb, 0, 2, 5000, &comm) == RESHARD_OK, "%s",
        reshard_last_error());
  reshard_spec_t* spec = NULL;
  CHECK(reshard_spec_from_json(kOneRank, &spec) == RESHARD_OK, "%s", reshard_last_error());
  int32_t src[24];
  reshard_buffer_t buffer = {"w", RESHARD_SOURCE, src, sizeof(src), RESHARD_MEMORY_HOST};
  reshard_handle_t* handle = NULL;
  reshard_status_t st =
      reshard_handle_create_with_timeout(comm, spec, &buffer, 1, NULL, 0, 5000, &handle);
  CHECK(st != RESHARD_OK && handle == NULL, "create gave %d", st);
  CHECK(strstr(reshard_last_error(), "hostile sizes were refused") != NULL, "last error: %s",
        reshard_last_error());
  CHECK(g_hostile_set_value == RESHARD_INVALID_ARGUMENT, "set_value(-1) gave %d",
        g_hostile_set_value);
  CHECK(g_hostile_add_entry == RESHARD_INVALID_ARGUMENT, "add_entry(INT64_MIN) gave %d",
        g_hostile_add_entry);
  reshard_spec_destroy(spec);
  reshard_comm_destroy(comm);
  RemoveStore(&store);
}

static void TestResultFunctions(void) {
  CHECK(reshard_store_result_set_value(NULL, "x", 1) == RESHARD_INVALID_ARGUMENT, "NULL result");
  CHECK(reshard_dtype_size(RESHARD_DTYPE_BF16) == 2, "bf16 size");
  CHECK(strcmp(reshard_dtype_name(RESHARD_DTYPE_FP8E4M3), "fp8e4m3") == 0, "fp8 name");
  CHECK(reshard_dtype_name(42) == NULL && reshard_dtype_size(-1) == 0, "no dtype");
}

int main(void) {
  /* DESIGN §5: every multi-process test fixes its transports. */
  setenv("UCX_TLS", "posix,sysv,cma,self", 1);
  setenv("UCX_NET_DEVICES", "all", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
  /* The forked ranks first: this process must not have started UCX when it forks. */
  TestRefitAcrossForkedRanks();
  TestResultFunctions();
  TestBadCallbacksAreReleasedAndNamed();
  TestCallbackErrorReachesLastError();
  TestHostileSizesAreRefused();
  TestGetTimeoutIsDeadlineExceeded();
  if (failures == 0) printf("c_store_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
