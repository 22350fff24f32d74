// The NCCL fan-out backend: one communicator per domain (its ranks in sorted order), created once
// per handle from a unique id that the domain's lowest rank publishes through the store.
//
// NCCL point-to-point calls match per peer in issue order, so both sides must agree on the order
// of pieces: the domain's fan-out edges are cut into fixed batches (FanoutOptions::
// nccl_batch_edges edges, in table order); every rank runs every batch in order as one
// ncclGroupStart/End holding its sends (one ncclSend per contiguous run) and receives of that
// batch. A rank issues batch k once every piece it sends in batches <= k has landed, so
// forwarding follows landing at batch granularity. An event after each batch reports its
// arrivals and completions.
//
// Viable when built with NCCL (RESHARD_HAVE_NCCL), a device is visible, the buffers are CUDA
// memory and every rank of the domain drives a different GPU (checked at Create()).
#pragma once

#include "src/nvlink/fanout.h"

namespace reshard::nvlink {

const FanoutFactory& NcclFactory();

}  // namespace reshard::nvlink
