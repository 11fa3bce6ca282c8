// Rung 03, last block: rung 02's blocks per (part, channel) in one launch, the last block of each channel to
// finish merging the channel's parts.
//   x [N,C,HW] -> mean[c] = sum x / count, var[c] = sum (x - mean)^2 / count (count = N x HW, biased),
//   invstd[c] = 1 / sqrt(var + eps); running_mean = (1 - momentum) old_running_mean + momentum mean,
//   running_var = (1 - momentum) old_running_var + momentum var count / (count - 1)
//
// What it adds over rung 02: no second kernel. Each block writes its part's (mean, M2), makes the write visible
// to the whole device (__threadfence) and bumps its channel's counter, the one atomic, on integers. The block that
// brings the counter to the number of parts is the last of its channel: every other part is written, so its first
// warp merges them all as rung 02's merge kernel did, in part order (the result does not depend on which block
// came last: still deterministic), and sets the counter back to zero for the next launch or graph replay. One
// launch less, and the merge starts as soon as the channel's last part is done, not when the whole grid is.
// Measured alone, in a graph, it is no faster than rung 02: every block now pays a fence, a barrier and an atomic,
// and a launch inside a graph costs little. It pays in the step, where a second launch would wait for the whole
// grid, and it is what lets rung 04 keep one launch.
// What it leaves: a block of THREADS threads per (part, channel) runs two passes over memory with a division and a
// remainder per element and a barrier-bound block_sum per pass, for a part that at the network's geometry is one
// to eight images of 196 values (rung 04).
//
// Launch (dev/ladder/bn_stats/op.py, launch_last_block): grid (parts, C), blocks of THREADS threads. THREADS,
// MAX_PARTS and MAX_CHANNELS come from there as -D options; the scratch, part_stats and blocks_done, is this
// module's own memory, sized from them (the counters start at zero and the last blocks leave them at zero).
#if !defined(THREADS) || !defined(MAX_PARTS) || !defined(MAX_CHANNELS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

__device__ float part_stats[MAX_CHANNELS * MAX_PARTS * 2];  // [C, parts, 2]: (mean, M2) of each (channel, part)
__device__ unsigned int blocks_done[MAX_CHANNELS] = {};     // per channel: its blocks that have written their part

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the block (THREADS threads); every thread gets the total, added in an order fixed by THREADS.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// Block (part, c): images [part * imgs_per_part, min(N, (part + 1) * imgs_per_part)) of channel c.
extern "C" __global__ void __launch_bounds__(THREADS)
    bn_stats_rung03_last_block(const float* x, int N, int C, int HW, int imgs_per_part, float eps, float momentum,
                               const float* old_running_mean, const float* old_running_var, float* mean, float* invstd,
                               float* running_mean, float* running_var) {
    __shared__ bool last;
    const int part = blockIdx.x, parts = gridDim.x, c = blockIdx.y;
    const int first = part * imgs_per_part, count = (min(N, first + imgs_per_part) - first) * HW;
    const float* xc = x + ((size_t)first * C + c) * HW;  // the part's first image in channel c; image j at j C HW
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += THREADS) s += xc[(size_t)(i / HW) * C * HW + i % HW];
    const float m = block_sum(s) / count;
    float q = 0.0f;
    for (int i = threadIdx.x; i < count; i += THREADS) {
        const float d = xc[(size_t)(i / HW) * C * HW + i % HW] - m;
        q += d * d;
    }
    const float m2 = block_sum(q);
    float* stats = part_stats + (size_t)c * parts * 2;  // channel c's parts
    if (threadIdx.x == 0) {
        stats[2 * part] = m;
        stats[2 * part + 1] = m2;
    }

    __threadfence();  // the part's pair is visible device-wide before the count says so
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&blocks_done[c], 1u) == parts - 1;
        if (last) blocks_done[c] = 0u;  // every block of the channel has counted: ready for the next launch
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;  // (no barrier follows)
    __threadfence();

    // The last block's first warp: rung 02's merge, the other blocks' pairs read from L2 (__ldcg).
    const int lane = threadIdx.x;
    const float total = (float)N * HW;
    float sum = 0.0f;
    for (int b = lane; b < parts; b += 32)
        sum += (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW * __ldcg(stats + 2 * b);
    const float mu = warp_sum(sum) / total;
    float sq = 0.0f;
    for (int b = lane; b < parts; b += 32) {
        const float n_b = (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW;
        const float d = __ldcg(stats + 2 * b) - mu;
        sq += __ldcg(stats + 2 * b + 1) + n_b * d * d;
    }
    const float var = warp_sum(sq) / total;
    if (lane == 0) {
        mean[c] = mu;
        invstd[c] = rsqrtf(var + eps);
        const float unbiased = total > 1.0f ? var * total / (total - 1.0f) : var;
        running_mean[c] = (1.0f - momentum) * old_running_mean[c] + momentum * mu;
        running_var[c] = (1.0f - momentum) * old_running_var[c] + momentum * unbiased;
    }
}
