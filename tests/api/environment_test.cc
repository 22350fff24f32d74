// The launch environment Communicator::FromEnvironment reads (src/api/environment.cc), as a
// pure function of the variables: every launcher, the precedence between them, the store,
// token and serving defaults, and one-sentence errors naming the variable.
#include "src/api/environment.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace {

using reshard::internal::LaunchEnvironment;
using reshard::internal::ParseLaunchEnvironment;
using Env = std::map<std::string, std::string>;

// The error message for `env`, which must be InvalidArgument.
std::string ErrorOf(const Env& env) {
  absl::StatusOr<LaunchEnvironment> parsed = ParseLaunchEnvironment(env);
  EXPECT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  return std::string(parsed.status().message());
}

// torchrun's variables for rank 1 of 4 on a node whose master is node0:29500.
Env Torchrun() {
  return {{"RANK", "1"},           {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job-42"}};
}

TEST(LaunchEnvironmentTest, ReshardVariables) {
  auto env = ParseLaunchEnvironment({{"RESHARD_RANK", "2"},
                                     {"RESHARD_WORLD_SIZE", "3"},
                                     {"RESHARD_STORE", "10.0.0.1:7000"},
                                     {"RESHARD_STORE_TOKEN", "s3cret"},
                                     {"RESHARD_TIMEOUT_MS", "1500"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "reshard");
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->world_size, 3);
  EXPECT_EQ(env->local_rank, -1);
  EXPECT_EQ(env->store_address, "10.0.0.1:7000");
  EXPECT_EQ(env->token, "s3cret");
  EXPECT_FALSE(env->serve_store);  // The reshard launcher serves its own store.
  EXPECT_EQ(env->timeout, absl::Milliseconds(1500));
}

TEST(LaunchEnvironmentTest, TorchrunServesOnTheMasterPortPlusOne) {
  auto env = ParseLaunchEnvironment(Torchrun());
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "torchrun");
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  // MASTER_PORT is torch's own TCPStore: reshard's takes the next port.
  EXPECT_EQ(env->store_address, "node0:29501");
  EXPECT_EQ(env->token, "job-42");
  EXPECT_TRUE(env->serve_store);
  EXPECT_EQ(env->timeout, absl::Seconds(30));
}

TEST(LaunchEnvironmentTest, TorchrunStorePortTokenAndServingOverrides) {
  Env e = Torchrun();
  e["RESHARD_STORE_PORT"] = "31000";
  e["RESHARD_STORE_TOKEN"] = "mine";
  e["RESHARD_STORE_SERVE"] = "0";
  auto env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_address, "node0:31000");
  EXPECT_EQ(env->token, "mine");
  EXPECT_FALSE(env->serve_store);
  // RESHARD_STORE wins over MASTER_ADDR and RESHARD_STORE_PORT.
  e["RESHARD_STORE"] = "store-host:4000";
  env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_address, "store-host:4000");
  // An IPv6 master gets brackets.
  e = Torchrun();
  e["MASTER_ADDR"] = "fd00::5";
  env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_address, "[fd00::5]:29501");
}

TEST(LaunchEnvironmentTest, TorchrunWithoutARunIdNeedsAToken) {
  Env e = Torchrun();
  e["TORCHELASTIC_RUN_ID"] = "none";  // torchrun's default --rdzv-id: no secret at all.
  EXPECT_NE(ErrorOf(e).find("RESHARD_STORE_TOKEN is not set"), std::string::npos);
  e.erase("TORCHELASTIC_RUN_ID");
  EXPECT_NE(ErrorOf(e).find("RESHARD_STORE_TOKEN"), std::string::npos);
}

TEST(LaunchEnvironmentTest, HalfSetEnvironmentsNameTheMissingVariable) {
  EXPECT_EQ(ErrorOf({{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not (torchrun); set both or "
                                      "neither");
  EXPECT_NE(ErrorOf({{"WORLD_SIZE", "2"}}).find("WORLD_SIZE is set but RANK is not"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"RESHARD_RANK", "0"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}})
                .find("RESHARD_RANK is set but RESHARD_WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"SLURM_PROCID", "0"}}).find("SLURM_PROCID is set but SLURM_NTASKS is not"),
            std::string::npos);
  Env e = Torchrun();
  e.erase("MASTER_ADDR");
  EXPECT_NE(ErrorOf(e).find("MASTER_ADDR is not set"), std::string::npos);
  e = Torchrun();
  e.erase("MASTER_PORT");
  EXPECT_NE(ErrorOf(e).find("MASTER_PORT is not set"), std::string::npos);
}

TEST(LaunchEnvironmentTest, MalformedValuesAreNamed) {
  Env e = Torchrun();
  e["RANK"] = "one";
  EXPECT_EQ(ErrorOf(e), "RANK=\"one\" is not an integer");
  e = Torchrun();
  e["RANK"] = "4";
  EXPECT_EQ(ErrorOf(e), "RANK=4 is outside the world of WORLD_SIZE=4 ranks");
  e = Torchrun();
  e["MASTER_PORT"] = "65535";  // Its successor is no port.
  EXPECT_NE(ErrorOf(e).find("MASTER_PORT=65535"), std::string::npos);
  e = Torchrun();
  e["LOCAL_RANK"] = "-1";
  EXPECT_NE(ErrorOf(e).find("LOCAL_RANK=-1"), std::string::npos);
  e = Torchrun();
  e["RESHARD_STORE_SERVE"] = "yes";
  EXPECT_NE(ErrorOf(e).find("RESHARD_STORE_SERVE=\"yes\""), std::string::npos);
  e = Torchrun();
  e["RESHARD_TIMEOUT_MS"] = "0";
  EXPECT_NE(ErrorOf(e).find("RESHARD_TIMEOUT_MS=0"), std::string::npos);
  e = Torchrun();
  e["WORLD_SIZE"] = "0";
  EXPECT_NE(ErrorOf(e).find("WORLD_SIZE=0"), std::string::npos);
}

TEST(LaunchEnvironmentTest, InnermostLauncherWins) {
  // torchrun started by srun inside an mpirun-free Slurm step: torchrun numbers the processes.
  Env e = Torchrun();
  e.insert({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
            {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  auto env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "torchrun");
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->local_rank, 1);
  // RESHARD_* before everything, as a pair (never RESHARD_RANK with torchrun's WORLD_SIZE).
  e.insert({{"RESHARD_RANK", "5"}, {"RESHARD_WORLD_SIZE", "6"}, {"RESHARD_STORE", "h:1"},
            {"RESHARD_STORE_TOKEN", "t"}});
  env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "reshard");
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 6);
  EXPECT_EQ(env->local_rank, -1);  // LOCAL_RANK is torchrun's, which did not name this rank.
  // mpirun inside a Slurm allocation: Open MPI's numbering.
  env = ParseLaunchEnvironment({{"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "8"},
                                {"OMPI_COMM_WORLD_RANK", "3"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"RESHARD_STORE", "h:1"},
                                {"RESHARD_STORE_TOKEN", "t"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "mpirun");
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_TRUE(env->serve_store);
  // RESHARD_LOCAL_RANK overrides any launcher's local rank.
  e = Torchrun();
  e["RESHARD_LOCAL_RANK"] = "3";
  EXPECT_EQ(ParseLaunchEnvironment(e)->local_rank, 3);
}

TEST(LaunchEnvironmentTest, SlurmNeedsAStoreAddress) {
  Env e = {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
           {"SLURM_JOB_NODELIST", "gpu[01-02]"}};
  EXPECT_NE(ErrorOf(e).find("RESHARD_STORE is not set and Slurm's variables name no store"),
            std::string::npos);
  e["RESHARD_STORE"] = "gpu01:29600";
  e["RESHARD_STORE_TOKEN"] = "t";
  auto env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->launcher, "Slurm");
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 0);
  EXPECT_TRUE(env->serve_store);
  // SLURM_NTASKS alone is an allocation's shell (salloc, a batch script), not a task.
  EXPECT_NE(ErrorOf({{"SLURM_NTASKS", "4"}}).find("RESHARD_RANK is not set"), std::string::npos);
}

TEST(LaunchEnvironmentTest, SingleHostMpirunMeetsInSharedMemory) {
  Env e = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-host-123@1"}};
  auto env = ParseLaunchEnvironment(e);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->file_store_directory, "/dev/shm/reshard-mpi-prterun_host_123_1");
  EXPECT_TRUE(env->store_address.empty());
  e["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1";  // Spans hosts: needs a TCP store.
  EXPECT_NE(ErrorOf(e).find("RESHARD_STORE is not set"), std::string::npos);
}

TEST(LaunchEnvironmentTest, NothingSetNamesTheVariablesToSet) {
  const std::string message = ErrorOf({});
  EXPECT_NE(message.find("RESHARD_RANK"), std::string::npos) << message;
  EXPECT_NE(message.find("torchrun"), std::string::npos) << message;
  // Empty values count as unset (a launcher script's `export RANK=`).
  EXPECT_EQ(ErrorOf({{"RANK", ""}, {"WORLD_SIZE", ""}}), message);
}

}  // namespace
