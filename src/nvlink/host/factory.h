// The host fan-out backend: ranks that are processes of one host copy landed pieces straight
// into each other's destination buffers (one copy) and signal through shared memory.
//
// How a sender reaches a receiver's destination buffer, per buffer, by capability:
//  - the receiver allocated it with SharedBuffer: the sender maps it once (shm_open +
//    mmap) and copies with memcpy;
//  - otherwise (the caller's private memory): process_vm_writev into the receiver, which needs
//    ptrace-attach permission. Create() proves it with a probe read of a token the receiver
//    published; when denied (Yama ptrace_scope, different users or pid namespaces) Create()
//    fails with FailedPrecondition saying to allocate with SharedBuffer. There is no silent
//    fallback after an error.
// Signals go through each receiver's SignalBoard (signal_board.h).
#pragma once

#include "src/nvlink/fanout.h"

namespace reshard::nvlink {

const FanoutFactory& HostFactory();

// Yama's ptrace_scope (0 when Yama is absent), which decides whether process_vm_writev into a
// sibling process is allowed.
int YamaPtraceScope();

}  // namespace reshard::nvlink
