// CPU time of the calling process, for the bench programs: on a shared machine, wall time also
// counts other programs.
#pragma once

#include <time.h>

namespace reshard::plan::bench {

inline double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace reshard::plan::bench
