// The CUDA IPC fan-out backend: ranks of one host whose destination buffers are device memory
// (processes on one or several GPUs of a node, over NVLink or PCIe).
//
// Once per handle every rank exports each destination buffer with cudaIpcGetMemHandle (the
// handle and the buffer's offset inside its allocation go through the store) and every sender
// opens its receivers' handles with cudaIpcOpenMemHandle. Per piece: one call on a dedicated
// non-blocking stream, chosen once per handle (src/nvlink/gpu_schedule.h, ChooseGpuCopy):
// cudaMemcpyAsync for a contiguous piece, cudaMemcpy2DAsync / cudaMemcpy3DAsync for rows (or
// slices of rows) of at least kMinCopyEngineRun bytes, otherwise one launch of the strided copy
// kernel (cuda::DeviceCopyBatches, descriptors uploaded once); an event recorded after it. When
// Progress() sees the event complete the receiver's SignalBoard slot is released, so the
// receiver never sees a signal before the bytes are in its memory. Nothing synchronises the
// device.
//
// Viable when built with CUDA (RESHARD_HAVE_CUDA), a device is visible and the buffers are
// CUDA memory. Links CUDA::cudart only (never libcuda; the driver entry point for the
// allocation range is looked up at run time through cudaGetDriverEntryPointByVersion).
#pragma once

#include "src/nvlink/fanout.h"

namespace reshard::nvlink {

const FanoutFactory& CudaIpcFactory();

}  // namespace reshard::nvlink
