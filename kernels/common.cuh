// common.cuh: helpers shared by every kernel file (textually inlined by mnist_cuda/kernels.py).
//
// Conventions for all kernels:
//  - tensors are dense float32 in PyTorch's NCHW layout; integer arguments are 32-bit (launch with
//    np.int32: a Python int would be passed as 64 bits and shift every later argument);
//  - no atomics on floats: every reduction has a fixed order, so training is bit-for-bit repeatable.
#pragma once

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

// Sum over a warp by butterfly exchange; every lane ends with the same total.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets the total.
// The order of additions depends only on blockDim.x, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();                      // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}
