#include "src/api/environment.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/common/status.h"

namespace reshard::internal {
namespace {

using Env = std::map<std::string, std::string>;

// Every variable ParseLaunchEnvironment looks at, so ReadLaunchVariables copies exactly these.
constexpr const char* kVariables[] = {
    "RESHARD_RANK",       "RESHARD_WORLD_SIZE",  "RESHARD_LOCAL_RANK",
    "RESHARD_STORE",      "RESHARD_STORE_PORT",  "RESHARD_STORE_TOKEN",
    "RESHARD_STORE_SERVE", "RESHARD_TIMEOUT_MS", "RANK",
    "WORLD_SIZE",         "LOCAL_RANK",          "MASTER_ADDR",
    "MASTER_PORT",        "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE",     "SLURM_PROCID",        "SLURM_NTASKS",
    "SLURM_LOCALID",
};

// One launcher's identity variables.
struct Launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
};
// Innermost first: a launcher started by another one sees the outer one's variables of its own
// task too, and only the inner one numbers the processes that call FromEnvironment.
constexpr Launcher kLaunchers[] = {
    {"reshard", "RESHARD_RANK", "RESHARD_WORLD_SIZE", "RESHARD_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

const std::string* Find(const Env& env, const char* name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty() ? &it->second : nullptr;
}

absl::StatusOr<int> Int(const Env& env, const char* name) {
  const std::string* v = Find(env, name);
  int out = 0;
  if (v == nullptr || !absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", v ? *v : "", "\" is not an integer"));
  }
  return out;
}

absl::StatusOr<int> Port(const Env& env, const char* name, int max) {
  RESHARD_ASSIGN_OR_RETURN(int port, Int(env, name));
  if (port < 1 || port > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", port, " is not a port between 1 and ", max));
  }
  return port;
}

// torchrun's MASTER_PORT belongs to torch's own TCPStore (another protocol), so reshard's store
// takes RESHARD_STORE_PORT, by default the port above it.
absl::StatusOr<std::string> TorchrunStore(const Env& env) {
  const std::string* addr = Find(env, "MASTER_ADDR");
  if (addr == nullptr) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is not set, yet RANK and WORLD_SIZE are (torchrun); reshard's store runs on "
        "MASTER_ADDR, so set it, or set RESHARD_STORE=host:port");
  }
  int port = 0;
  if (Find(env, "RESHARD_STORE_PORT") != nullptr) {
    RESHARD_ASSIGN_OR_RETURN(port, Port(env, "RESHARD_STORE_PORT", 65535));
  } else if (Find(env, "MASTER_PORT") != nullptr) {
    RESHARD_ASSIGN_OR_RETURN(int master, Port(env, "MASTER_PORT", 65534));
    port = master + 1;
  } else {
    return absl::InvalidArgumentError(
        "MASTER_PORT is not set, yet MASTER_ADDR is (torchrun); reshard's store listens on "
        "MASTER_PORT + 1 unless RESHARD_STORE_PORT names its port");
  }
  // A bare IPv6 address needs brackets before the port.
  const bool v6 = addr->find(':') != std::string::npos && addr->front() != '[';
  return v6 ? absl::StrCat("[", *addr, "]:", port) : absl::StrCat(*addr, ":", port);
}

}  // namespace

absl::StatusOr<LaunchEnvironment> ParseLaunchEnvironment(const Env& env) {
  LaunchEnvironment out;
  const Launcher* launcher = nullptr;
  for (const Launcher& l : kLaunchers) {
    const bool has_rank = Find(env, l.rank) != nullptr;
    const bool has_size = Find(env, l.world_size) != nullptr;
    // Slurm sets SLURM_NTASKS in a whole allocation (salloc, the batch script), SLURM_PROCID
    // only in its tasks: a size alone says nothing there.
    if (!has_rank && (!has_size || std::string(l.name) == "Slurm")) continue;
    if (!has_rank || !has_size) {
      const char* set = has_rank ? l.rank : l.world_size;
      const char* missing = has_rank ? l.world_size : l.rank;
      return absl::InvalidArgumentError(absl::StrCat(set, " is set but ", missing, " is not (",
                                                     l.name, "); set both or neither"));
    }
    launcher = &l;
    break;
  }
  if (launcher == nullptr) {
    return absl::InvalidArgumentError(
        "RESHARD_RANK is not set and no launcher's variables are (torchrun's RANK, mpirun's "
        "OMPI_COMM_WORLD_RANK, Slurm's SLURM_PROCID); set RESHARD_RANK and RESHARD_WORLD_SIZE "
        "or start the program with one of those launchers");
  }
  out.launcher = launcher->name;
  RESHARD_ASSIGN_OR_RETURN(out.rank, Int(env, launcher->rank));
  RESHARD_ASSIGN_OR_RETURN(out.world_size, Int(env, launcher->world_size));
  if (out.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(launcher->world_size, "=", out.world_size, " is not a positive world size"));
  }
  if (out.rank < 0 || out.rank >= out.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(launcher->rank, "=", out.rank,
                                                   " is outside the world of ", launcher->world_size,
                                                   "=", out.world_size, " ranks"));
  }
  const char* local = Find(env, "RESHARD_LOCAL_RANK") != nullptr ? "RESHARD_LOCAL_RANK"
                      : Find(env, launcher->local_rank) != nullptr ? launcher->local_rank
                                                                    : nullptr;
  if (local != nullptr) {
    RESHARD_ASSIGN_OR_RETURN(out.local_rank, Int(env, local));
    if (out.local_rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(local, "=", out.local_rank, " is not a local rank (0 or more)"));
    }
  }
  if (Find(env, "RESHARD_TIMEOUT_MS") != nullptr) {
    RESHARD_ASSIGN_OR_RETURN(int ms, Int(env, "RESHARD_TIMEOUT_MS"));
    if (ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("RESHARD_TIMEOUT_MS=", ms, " must be positive"));
    }
    out.timeout = absl::Milliseconds(ms);
  }

  const bool torchrun = out.launcher == "torchrun";
  if (const std::string* store = Find(env, "RESHARD_STORE")) {
    out.store_address = *store;
  } else if (torchrun) {
    RESHARD_ASSIGN_OR_RETURN(out.store_address, TorchrunStore(env));
  } else if (out.launcher == "mpirun") {
    const std::string* job = Find(env, "PMIX_NAMESPACE");
    const std::string* local_size = Find(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
    int on_this_host = 0;
    if (job == nullptr || local_size == nullptr || !absl::SimpleAtoi(*local_size, &on_this_host) ||
        on_this_host != out.world_size) {
      return absl::InvalidArgumentError(
          "RESHARD_STORE is not set and this mpirun job spans hosts; give the rendezvous store "
          "as host:port (-x RESHARD_STORE=<host of rank 0>:<port> -x "
          "RESHARD_STORE_TOKEN=<secret>)");
    }
    // Every rank of this mpirun job is on this host: meet in shared memory, no port needed.
    std::string name = *job;
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    out.file_store_directory = absl::StrCat("/dev/shm/reshard-mpi-", name);
    return out;
  } else if (out.launcher == "Slurm") {
    // Slurm names no master: the step's node list may be compressed ("gpu[01-16]"), task 0 need
    // not run on its first node, and a node's name need not reach the fabric's interface.
    return absl::InvalidArgumentError(
        "RESHARD_STORE is not set and Slurm's variables name no store address; export "
        "RESHARD_STORE=<host of task 0>:<port> before srun, e.g. with the first host of "
        "`scontrol show hostnames \"$SLURM_JOB_NODELIST\"`");
  } else {
    return absl::InvalidArgumentError(
        "RESHARD_STORE is not set; give the rendezvous store as host:port");
  }

  if (const std::string* token = Find(env, "RESHARD_STORE_TOKEN")) {
    out.token = *token;
  } else if (const std::string* run = Find(env, "TORCHELASTIC_RUN_ID");
             torchrun && run != nullptr && *run != "none") {
    // torchrun's run id: random under --standalone, the --rdzv-id otherwise (docs/configuration.md
    // says what that protects against and what not).
    out.token = *run;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "RESHARD_STORE_TOKEN is not set; every rank must present the store's shared secret",
        torchrun ? " (under torchrun, a TORCHELASTIC_RUN_ID other than \"none\" also serves)"
                 : ""));
  }

  if (const std::string* serve = Find(env, "RESHARD_STORE_SERVE")) {
    if (*serve != "0" && *serve != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("RESHARD_STORE_SERVE=\"", *serve, "\" is neither 0 nor 1"));
    }
    out.serve_store = *serve == "1";
  } else {
    // Launchers other than reshard's own run no reshard store: rank 0 serves it, like torchrun's
    // master serves torch's.
    out.serve_store = out.launcher != "reshard";
  }
  return out;
}

std::map<std::string, std::string> ReadLaunchVariables() {
  std::map<std::string, std::string> env;
  for (const char* name : kVariables) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

}  // namespace reshard::internal
