// Rung 01, naive: a block per channel, two passes over the channel's N x HW values (the mean, then the squared
// deviations from it), each a strided gather reduced with block_sum.
//   x [N,C,HW] -> mean[c] = sum x / count, var[c] = sum (x - mean)^2 / count (count = N x HW, biased),
//   invstd[c] = 1 / sqrt(var + eps); running_mean = (1 - momentum) running_mean + momentum mean,
//   running_var = (1 - momentum) running_var + momentum var count / (count - 1) (in place)
//
// This is the product's naive kernel, batchnorm_stats_naive of kernels/naive/3_batchnorm.cu, copied verbatim so that
// the ladder's files stand alone (tests/test_ladder.py keeps the two the same), with the two helpers it calls from
// kernels/include/common.cuh. It is the yardstick every later rung is checked and timed against. What it leaves on
// the table: C blocks in all (64 at the network's geometry, fewer than the GPU has SMs), each of them alone with a
// whole channel of the batch; x read twice; an integer division and a remainder for every element it reads.
//
// Launch (dev/ladder/bn_stats/op.py, launch_naive): grid C, blocks of 256 threads (blockDim.x a multiple of 32).


// Sum over a warp by butterfly exchange; every lane ends with the same total (float or double).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets the total.
// The order of additions depends only on blockDim.x, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// Per channel: mean, invstd = 1/sqrt(var + eps), and the running-statistics update. Two passes
// over the channel (mean first, then squared deviations) for an accurate variance.
extern "C" __global__ void batchnorm_stats_naive(const float* x, float* mean, float* invstd, float* running_mean,
                                                 float* running_var, int N, int C, int HW, float eps, float momentum) {
    const int c = blockIdx.x, count = N * HW;
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += x[((i / HW) * C + c) * HW + i % HW];
    const float m = block_sum(s) / count;
    float q = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        float d = x[((i / HW) * C + c) * HW + i % HW] - m;
        q += d * d;
    }
    const float var = block_sum(q) / count;
    if (threadIdx.x == 0) {
        mean[c] = m;
        invstd[c] = rsqrtf(var + eps);
        float unbiased = count > 1 ? var * count / (count - 1) : var;
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
        running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
}
