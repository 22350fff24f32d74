// RESHARD_HD marks a function that nvcc compiles for both host and device.
//
// Headers whose arithmetic the CUDA kernels and their host references share (the pack index,
// the FP8 quantization math) mark their functions with it, so one definition is tested on
// machines without a GPU and runs unchanged in the kernels. A plain C++ compiler sees nothing.
#pragma once

#ifndef RESHARD_HD
#if defined(__CUDACC__)
#define RESHARD_HD __host__ __device__
#else
#define RESHARD_HD
#endif
#endif
