// The one UCX_TLS parser (src/net/ucx/tls.h) and the two decisions taken from it.
#include "src/net/ucx/tls.h"

#include "gtest/gtest.h"
#include "src/net/ucx/context.h"

namespace reshard::net::ucx {
namespace {

TEST(TlsSelectionTest, UcxChoosesWhenUnsetAllOrExclusion) {
  for (const char* tls : {"", "all", "tcp,all", "^sm", "^tcp,cma"}) {
    const TlsSelection s = TlsSelection::Parse(tls);
    EXPECT_TRUE(s.ucx_chooses) << tls;
    EXPECT_TRUE(s.network()) << tls;
    EXPECT_TRUE(s.rdma()) << tls;
  }
}

TEST(TlsSelectionTest, NamedTransports) {
  const TlsSelection tcp = TlsSelection::Parse("tcp");
  EXPECT_FALSE(tcp.ucx_chooses);
  EXPECT_TRUE(tcp.Names("tcp"));
  EXPECT_TRUE(tcp.network());
  EXPECT_FALSE(tcp.rdma());

  const TlsSelection sm = TlsSelection::Parse("posix,sysv,cma,self");
  EXPECT_FALSE(sm.network());
  EXPECT_FALSE(sm.rdma());
  EXPECT_FALSE(sm.Names("tcp"));

  for (const char* rdma : {"rc_x,sm,self", "ud,tcp", "dc_mlx5", "ib"}) {
    const TlsSelection s = TlsSelection::Parse(rdma);
    EXPECT_TRUE(s.rdma()) << rdma;
    EXPECT_TRUE(s.network()) << rdma;
  }
}

TEST(TlsSelectionTest, PeerErrorHandlingIsTheNetworkDecision) {
  EXPECT_TRUE(TlsSupportsPeerErrorHandling(""));
  EXPECT_TRUE(TlsSupportsPeerErrorHandling("sm,tcp"));
  EXPECT_FALSE(TlsSupportsPeerErrorHandling("sm,self"));
  EXPECT_FALSE(TlsSupportsPeerErrorHandling("cuda_copy,cuda_ipc,posix"));
}

TEST(TlsSelectionTest, SharedMemoryLanesAreThoseThroughHostMemory) {
  EXPECT_TRUE(SharedMemoryLanes("sysv/memory posix/memory cma/memory"));
  EXPECT_TRUE(SharedMemoryLanes("tcp/lo xpmem/memory"));
  EXPECT_FALSE(SharedMemoryLanes("tcp/lo"));
  EXPECT_FALSE(SharedMemoryLanes("rc_mlx5/mlx5_0:1 cuda_ipc/cuda"));
  EXPECT_FALSE(SharedMemoryLanes(""));
}

TEST(TlsSelectionTest, EmulatedRmaLanesAreSharedMemoryAndTcp) {
  EXPECT_TRUE(EmulatedRmaLanes("sysv/memory posix/memory cma/memory"));
  EXPECT_TRUE(EmulatedRmaLanes("tcp/lo"));
  EXPECT_TRUE(EmulatedRmaLanes("tcp/eth0 sysv/memory"));
  EXPECT_FALSE(EmulatedRmaLanes("rc_mlx5/mlx5_0:1 ud_mlx5/mlx5_0:1"));
  EXPECT_FALSE(EmulatedRmaLanes(""));
}

}  // namespace
}  // namespace reshard::net::ucx
