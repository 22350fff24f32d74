// Subcommands of the `reshard` CLI. Each returns the process exit status:
// 0 success, 1 the operation ran and failed (verification, refit), 2 invalid input or usage,
// 3 a device the command was asked to use is not there (`reshard run --memory cuda`).
#pragma once

namespace reshard::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNoDevice = 3;

int PlanCommand(int argc, char** argv);
int SimCommand(int argc, char** argv);
int SpecCommand(int argc, char** argv);
int RunCommand(int argc, char** argv);
int InfoCommand(int argc, char** argv);
int BenchCommand(int argc, char** argv);
int StoreCommand(int argc, char** argv);

}  // namespace reshard::cli
