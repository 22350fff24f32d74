// What this machine offers for refits, as the library sees it: the UCX it loaded (version,
// library path, transports and devices, memory types it can register), CUDA devices, NCCL, RDMA
// NICs. `reshard info` prints it; frameworks can log it next to their own set-up.
//
// CUDA, NCCL and libibverbs are opened with dlopen, so probing works (and says why not) on
// machines without them; libcuda is never linked. Nothing here fails: every probe failure is a
// sentence in the matching `error` / `why_none` field. Thread-compatible; each call probes anew
// (a UCX context is created and destroyed, tens of milliseconds).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace reshard {

struct UcxInfo {
  std::string version;        // ucp_get_version_string(): the UCX this process runs against
  std::string built_against;  // "major.minor" of the UCX headers reshard was compiled with
  std::string library;        // the libucp actually loaded (resolved path)
  std::string error;          // why the context could not be created ("" when it could)
  // Set when the loaded libucp is older than the headers (a library path that picks another
  // UCX than the build's): UCX does not support running against an older minor version.
  std::string version_warning;
  std::vector<std::pair<std::string, std::string>> resources;  // (transport, device)
  std::vector<std::string> memory_types;  // "host", "cuda", ... that UCX can register
  // Whether UCX registers CUDA device memory ("cuda" among memory_types): refits then put GPU
  // buffers directly; otherwise they are staged through pinned host memory.
  bool registers_cuda_memory = false;
};

struct CudaInfo {
  std::string library;          // the libcudart opened
  std::string runtime_version;  // "13.0"
  int devices = 0;
  std::vector<std::string> pci_bus_ids;
  std::string why_none;  // why devices is 0
};

struct NcclInfo {
  std::string library;
  std::string version;  // "2.28.3"; empty when absent
  std::string why_none;
};

struct RdmaPort {
  std::string port, state, link_layer, rate;  // from /sys/class/infiniband/<nic>/ports/<port>
};
struct RdmaNic {
  std::string name;
  std::string numa_node;
  std::vector<RdmaPort> ports;
};
struct RdmaInfo {
  std::vector<RdmaNic> nics;
  std::string why_none;
};

struct SystemInfo {
  UcxInfo ucx;
  CudaInfo cuda;
  NcclInfo nccl;
  RdmaInfo rdma;
};

// Probes UCX, CUDA, NCCL and RDMA NICs (see the file comment).
SystemInfo ProbeSystem();

}  // namespace reshard
