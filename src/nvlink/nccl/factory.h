// The NCCL fan-out backend: one communicator per domain (its ranks in sorted order), created once
// per handle from a unique id that the domain's lowest rank publishes through the store.
//
// NCCL point-to-point calls match per peer in issue order, so every rank derives the same
// schedule from the table (src/nvlink/gpu_schedule.h): the domain's fan-out edges are cut into
// fixed batches (FanoutOptions::nccl_batch_edges edges, in table order), each run as one or more
// rounds. In a round a sender packs every piece it sends a peer into its device staging with one
// pack-kernel launch (cuda::DevicePackBatches), issues one ncclSend per peer and one ncclRecv per
// sending peer in one ncclGroupStart/End, and unpacks what it received with one launch; all on
// the backend's own stream. Staging is allocated once per handle and never holds more than
// FanoutOptions::gpu_staging_bytes: a batch that needs more runs in several rounds. A rank issues
// batch k once every piece it sends in batches <= k has landed, so forwarding follows landing at
// batch granularity. An event after each batch reports its arrivals and completions.
//
// Viable when built with NCCL (RESHARD_HAVE_NCCL), a device is visible, the buffers are CUDA
// memory and every rank of the domain drives a different GPU and uses the same batching options
// (checked at Create()).
#pragma once

#include "src/nvlink/fanout.h"

namespace reshard::nvlink {

const FanoutFactory& NcclFactory();

}  // namespace reshard::nvlink
