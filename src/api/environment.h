// What Communicator::FromEnvironment reads from the environment, decided by a pure function of
// the variables so every launcher's rules are unit-tested without touching the process's
// environment (tests/api/environment_test.cc). Not installed.
//
// Launchers, in precedence order (the first whose identity variables are present wins, and rank,
// world size and local rank all come from that one launcher; docs/configuration.md):
//   1. reshard   RESHARD_RANK, RESHARD_WORLD_SIZE [, RESHARD_LOCAL_RANK]
//   2. torchrun  RANK, WORLD_SIZE [, LOCAL_RANK], MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID
//   3. mpirun    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE [, OMPI_COMM_WORLD_LOCAL_RANK]
//   4. Slurm     SLURM_PROCID, SLURM_NTASKS [, SLURM_LOCALID]
// The innermost launcher wins: torchrun started by srun or mpirun sees Slurm's or Open MPI's
// variables of its own task too, and its RANK is the one that names this process.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace reshard::internal {

struct LaunchEnvironment {
  // "reshard", "torchrun", "mpirun" or "Slurm": which launcher's variables named this rank.
  std::string launcher;
  int rank = 0;
  int world_size = 0;
  int local_rank = -1;  // -1: the launcher gave none.
  // "host:port" of the TCP store; empty when `file_store_directory` is set instead.
  std::string store_address;
  // A single-host mpirun job without RESHARD_STORE: its ranks meet in this directory.
  std::string file_store_directory;
  std::string token;
  bool serve_store = false;
  absl::Duration timeout = absl::Seconds(30);
};

// Decides rank, world size, local rank, store, token, serving and timeout from `env` (name ->
// value; an empty value counts as unset). InvalidArgument in one sentence naming the missing or
// malformed variable.
[[nodiscard]] absl::StatusOr<LaunchEnvironment> ParseLaunchEnvironment(
    const std::map<std::string, std::string>& env);

// The variables ParseLaunchEnvironment reads, taken from this process's environment.
std::map<std::string, std::string> ReadLaunchVariables();

}  // namespace reshard::internal
