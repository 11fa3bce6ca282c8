// Rung 04, warp per channel: a warp owns a (part, channel), holds each image's values of the channel in registers
// and reduces them with shuffles alone; CHANNELS warps, CHANNELS channels, share a block and its last-block merge.
//   x [N,C,HW] -> mean[c] = sum x / count, var[c] = sum (x - mean)^2 / count (count = N x HW, biased),
//   invstd[c] = 1 / sqrt(var + eps); running_mean = (1 - momentum) old_running_mean + momentum mean,
//   running_var = (1 - momentum) old_running_var + momentum var count / (count - 1)
//
// What it adds over rung 03: x is read once, by warps that need no barrier. A channel's values of one image are
// HW contiguous floats; lane l loads values l, l + 32, ..., VALUES of them into registers (coalesced, no division
// or remainder), the warp takes their mean (warp_sum), then their squared deviations from it from the registers:
// the second pass costs no memory traffic. Chan's merge folds each image into the part's running (mean, M2, count)
// in image order (an image longer than 32 x VALUES goes in chunks, each merged the same way). The reductions are
// shuffles within the warp, so no __syncthreads stands between a warp and its next loads, and a block of CHANNELS
// warps takes CHANNELS channels of a part with one counter per group of channels: in the group's last block warp
// w merges channel c0 + w, rung 03's merge. What it leaves: a warp has one image's loads in flight at a time, so
// it waits a memory latency per image; the product keeps two images' loads in flight (BN_STATS_IMAGES).
//
// Launch (dev/ladder/bn_stats/op.py, launch_warp_per_channel): grid (parts, ceil(C / CHANNELS)), blocks of
// 32 x CHANNELS threads. CHANNELS, VALUES, MAX_PARTS and MAX_CHANNELS come from there as -D options; the scratch,
// part_stats and blocks_done, is this module's own memory, sized from them.
#if !defined(CHANNELS) || !defined(VALUES) || !defined(MAX_PARTS) || !defined(MAX_CHANNELS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define THREADS (32 * CHANNELS)
#define CHUNK (32 * VALUES)  // the values of an image a warp holds at once

__device__ float part_stats[MAX_CHANNELS * MAX_PARTS * 2];  // [C, parts, 2]: (mean, M2) of each (channel, part)
__device__ unsigned int blocks_done[MAX_CHANNELS] = {};     // per group of CHANNELS channels: blocks done

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Chan et al.: (mean, m2, n) becomes the statistics of itself and a set (mean_b, m2_b, n_b), n_b > 0.
__device__ __forceinline__ void chan_merge(float* mean, float* m2, float* n, float mean_b, float m2_b, float n_b) {
    const float total = *n + n_b, delta = mean_b - *mean, f = n_b / total;
    *mean += delta * f;
    *m2 += m2_b + delta * delta * *n * f;
    *n = total;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    bn_stats_rung04_warp_per_channel(const float* x, int N, int C, int HW, int imgs_per_part, float eps, float momentum,
                                     const float* old_running_mean, const float* old_running_var, float* mean,
                                     float* invstd, float* running_mean, float* running_var) {
    __shared__ bool last;
    const int lane = threadIdx.x % 32, part = blockIdx.x, parts = gridDim.x;
    const int c = blockIdx.y * CHANNELS + threadIdx.x / 32;  // this warp's channel
    if (c < C) {                                             // (the whole warp: a warp's lanes share c)
        float mu = 0.0f, m2 = 0.0f, n = 0.0f;
        for (int img = part * imgs_per_part; img < min(N, (part + 1) * imgs_per_part); img++) {
            const float* xi = x + ((size_t)img * C + c) * HW;
            for (int p0 = 0; p0 < HW; p0 += CHUNK) {
                float v[VALUES];
#pragma unroll
                for (int i = 0; i < VALUES; i++) v[i] = p0 + lane + 32 * i < HW ? xi[p0 + lane + 32 * i] : 0.0f;
                const float k = (float)min(HW - p0, CHUNK);  // the chunk's values
                float s = 0.0f, q = 0.0f;
#pragma unroll
                for (int i = 0; i < VALUES; i++) s += v[i];
                const float chunk_mean = warp_sum(s) / k;
#pragma unroll
                for (int i = 0; i < VALUES; i++) {
                    const float d = p0 + lane + 32 * i < HW ? v[i] - chunk_mean : 0.0f;
                    q += d * d;
                }
                chan_merge(&mu, &m2, &n, chunk_mean, warp_sum(q), k);
            }
        }
        if (lane == 0) {
            part_stats[((size_t)c * parts + part) * 2] = mu;
            part_stats[((size_t)c * parts + part) * 2 + 1] = m2;
        }
    }

    __threadfence();  // the pairs are visible device-wide before the count says so
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&blocks_done[blockIdx.y], 1u) == parts - 1;
        if (last) blocks_done[blockIdx.y] = 0u;  // every block of the group has counted: ready for the next launch
    }
    __syncthreads();
    if (!last || c >= C) return;  // (no barrier follows)
    __threadfence();

    // The group's last block: warp w merges channel c's parts (rung 03's merge), read from L2 (__ldcg).
    const float* stats = part_stats + (size_t)c * parts * 2;
    const float total = (float)N * HW;
    float sum = 0.0f;
    for (int b = lane; b < parts; b += 32)
        sum += (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW * __ldcg(stats + 2 * b);
    const float m = warp_sum(sum) / total;
    float sq = 0.0f;
    for (int b = lane; b < parts; b += 32) {
        const float n_b = (float)(min(N, (b + 1) * imgs_per_part) - b * imgs_per_part) * HW;
        const float d = __ldcg(stats + 2 * b) - m;
        sq += __ldcg(stats + 2 * b + 1) + n_b * d * d;
    }
    const float var = warp_sum(sq) / total;
    if (lane == 0) {
        mean[c] = m;
        invstd[c] = rsqrtf(var + eps);
        const float unbiased = total > 1.0f ? var * total / (total - 1.0f) : var;
        running_mean[c] = (1.0f - momentum) * old_running_mean[c] + momentum * m;
        running_var[c] = (1.0f - momentum) * old_running_var[c] + momentum * unbiased;
    }
}
