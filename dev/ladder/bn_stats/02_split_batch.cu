// Rung 02, split batch: a block per (part of the batch, channel) takes its part's mean and M2 (the sum of squared
// deviations from that mean), and a second kernel, a warp per channel, merges the parts and finishes the channel.
//   x [N,C,HW] -> mean[c] = sum x / count, var[c] = sum (x - mean)^2 / count (count = N x HW, biased),
//   invstd[c] = 1 / sqrt(var + eps); running_mean = (1 - momentum) old_running_mean + momentum mean,
//   running_var = (1 - momentum) old_running_var + momentum var count / (count - 1)
//
// What it adds over rung 01: parallelism across the batch. Rung 01 has C blocks, one per channel, so at the
// network's geometry (64 blocks) about half the SMs have nothing to do and each busy one walks a whole channel of
// the batch, one load latency after another. Here the batch is cut into parts of imgs_per_part images (at most
// MAX_PARTS parts) and a block takes one (part, channel): parts x C blocks. Each block runs rung 01's two passes over
// its part only (at most 64 images of the channel, 50 KB at the network's geometry: the second pass mostly finds it in
// cache) and writes its (mean, M2) to part_stats. The merge kernel then combines a channel's parts with Chan et al.'s
// parallel formula: mean = sum n_b mean_b / n and M2 = sum (M2_b + n_b (mean_b - mean)^2), stable because each part's
// deviations were taken from its own mean. The parts are added in a fixed order, so the result is the same on every run
// (no float atomics). What it leaves: a second launch, and the gap between the two kernels, for a merge of at most
// MAX_PARTS pairs per channel (rung 03).
//
// Launch (dev/ladder/bn_stats/op.py, launch_split_batch): parts: grid (parts, C), blocks of THREADS threads;
// merge: grid C, blocks of 32 threads. THREADS, MAX_PARTS and MAX_CHANNELS come from there as -D options; the
// scratch, part_stats, is this module's own memory, sized from them.
#if !defined(THREADS) || !defined(MAX_PARTS) || !defined(MAX_CHANNELS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

__device__ float part_stats[MAX_CHANNELS * MAX_PARTS * 2];  // [C, parts, 2]: (mean, M2) of each (channel, part)

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
    bn_stats_rung02_split_batch_parts(const float* x, int N, int C, int HW, int imgs_per_part) {
    const int part = blockIdx.x, c = blockIdx.y;
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
    if (threadIdx.x == 0) {
        part_stats[((size_t)c * gridDim.x + part) * 2] = m;
        part_stats[((size_t)c * gridDim.x + part) * 2 + 1] = m2;
    }
}

// Warp c: channel c's parts merged (lane l takes parts l, l + 32, ...), then its statistics and running update.
extern "C" __global__ void __launch_bounds__(32)
    bn_stats_rung02_split_batch_merge(int N, int C, int HW, int imgs_per_part, int parts, float eps, float momentum,
                                      const float* old_running_mean, const float* old_running_var, float* mean,
                                      float* invstd, float* running_mean, float* running_var) {
    const int c = blockIdx.x, lane = threadIdx.x;
    const float total = (float)N * HW;
    const float* stats = part_stats + (size_t)c * parts * 2;
    float s = 0.0f;
    for (int b = lane; b < parts; b += 32)
        s += (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW * stats[2 * b];
    const float m = warp_sum(s) / total;
    float q = 0.0f;
    for (int b = lane; b < parts; b += 32) {
        const float n_b = (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW, d = stats[2 * b] - m;
        q += stats[2 * b + 1] + n_b * d * d;
    }
    const float var = warp_sum(q) / total;
    if (lane == 0) {
        mean[c] = m;
        invstd[c] = rsqrtf(var + eps);
        const float unbiased = total > 1.0f ? var * total / (total - 1.0f) : var;
        running_mean[c] = (1.0f - momentum) * old_running_mean[c] + momentum * m;
        running_var[c] = (1.0f - momentum) * old_running_var[c] + momentum * unbiased;
    }
}
