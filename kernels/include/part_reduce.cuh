// part_reduce.cuh: the per-part reductions over the batch that the fast BatchNorm kernels share. A
// launch gives each block a part of the batch; each block writes its per-channel pairs, and the last
// block of a channel group (last_block_done, common.cuh) merges the parts in a fixed order.
// MAX_PARTS (the most parts a launch may have) comes from mnist_cuda/ops as an NVRTC -D option.
#pragma once
#include "common.cuh"
#if !defined(MAX_PARTS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif

// Chan et al.'s merge of two sets' (mean, M2 = sum of squared deviations, count): (mean, m2, n)
// becomes the statistics of both. Stable, because each set's deviations were taken from its own mean.
__device__ __forceinline__ void chan_merge(float* mean, float* m2, float* n, float mean_b, float m2_b, float n_b) {
    if (n_b == 0.0f) return;
    const float total = *n + n_b, delta = mean_b - *mean, f = n_b / total;
    *mean += delta * f;
    *m2 += m2_b + delta * delta * *n * f;
    *n = total;
}

// Where block b of a per-part reduction puts its pair (or pairs) for channel c: partial [C, parts, 2],
// a channel's parts side by side, so that the warp merging the channel reads them coalesced.
__device__ __forceinline__ float* part_pair(float* partial, int c, int parts, int b) {
    return partial + ((size_t)c * parts + b) * 2;
}

// In a block that merges a channel group (a reduction's last block, or a block of batchnorm_stats_from_parts_fast):
// hand each channel c in [c0, c1)'s per-part pairs (parts <= 32 * LANE_PARTS) to reduce(c, v), called by every lane
// of the warp that owns c; lane l holds parts l, l + 32, ... in v[0], v[1], ... (zeros past the end), loaded as
// float2.
#define PARTS_PER_LANE (MAX_PARTS / 32)
template <int LANE_PARTS = PARTS_PER_LANE, class Reduce>
__device__ __forceinline__ void reduce_channel_parts(const float* partial, int parts, int c0, int c1, Reduce reduce) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int c = c0 + threadIdx.x / 32; c < c1; c += warps) {
        float v[LANE_PARTS][2];
#pragma unroll
        for (int i = 0; i < LANE_PARTS; i++) {
            const int b = lane + 32 * i;
            const float2 pair = b < parts ? __ldcg(reinterpret_cast<const float2*>(partial) + (size_t)c * parts + b)
                                          : make_float2(0.0f, 0.0f);
            v[i][0] = pair.x;
            v[i][1] = pair.y;
        }
        reduce(c, v);
    }
}

// In a block that merges channel group [c0, c1): BatchNorm statistics per channel from per-(channel, part)
// pairs (mean, M2) in partial [C, parts, 2] (parts <= 32 * LANE_PARTS); part b holds count_of(b) values of each
// channel, total = N x hw in all. This is the parallel form of Chan et al.'s merge: mean = sum(n_b mean_b) / n,
// M2 = sum(M2_b + n_b (mean_b - mean)^2), stable because each part's deviations were taken from its own mean (or
// from a value near it). Then batchnorm_finalize, by thread c - c0 for channel c: the warps leave (mean, variance)
// in save_mean and save_invstd first. (Done by the warp that merged the channel, each channel's read of its
// running statistics waited for the previous channel's writes, which it may alias: a memory latency per channel.)
template <int LANE_PARTS, class CountOf>
__device__ void batchnorm_merge_finalize(const float* partial, int parts, CountOf count_of, float total, int c0, int c1,
                                         float eps, float momentum, float* save_mean, float* save_invstd,
                                         float* running_mean, float* running_var) {
    const int lane = threadIdx.x % 32;
    reduce_channel_parts<LANE_PARTS>(partial, parts, c0, c1, [&](int c, const float(&v)[LANE_PARTS][2]) {
        float n_b[LANE_PARTS], s = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < LANE_PARTS; i++) {
            const int b = lane + 32 * i;
            n_b[i] = b < parts ? count_of(b) : 0.0f;
            s += n_b[i] * v[i][0];
        }
        const float mean = warp_sum(s) / total;
#pragma unroll
        for (int i = 0; i < LANE_PARTS; i++) q += v[i][1] + n_b[i] * (v[i][0] - mean) * (v[i][0] - mean);
        const float m2 = warp_sum(q);
        if (lane == 0) {
            save_mean[c] = mean;
            save_invstd[c] = m2 / total;  // the variance, until the finalize below
        }
    });
    __syncthreads();  // (a block sees its own global writes after a barrier)
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        batchnorm_finalize(c, save_mean[c], save_invstd[c], total, eps, momentum, save_mean, save_invstd, running_mean,
                           running_var);
}

// The same for parts of imgs_per_block images of hw values each (the last part holds the rest of N), at most
// MAX_PARTS of them.
__device__ void batchnorm_merge_finalize(const float* partial, int parts, int imgs_per_block, int N, int hw, int c0,
                                         int c1, float eps, float momentum, float* save_mean, float* save_invstd,
                                         float* running_mean, float* running_var) {
    const auto count_of = [&](int b) { return (float)(min(N, (b + 1) * imgs_per_block) - b * imgs_per_block) * hw; };
    batchnorm_merge_finalize<PARTS_PER_LANE>(partial, parts, count_of, (float)N * hw, c0, c1, eps, momentum, save_mean,
                                             save_invstd, running_mean, running_var);
}

// In the last block of channel group [c0, c1): out0[c] = sum_b partial[c, b, 0], out1[c] = sum_b
// partial[c, b, 1] (fixed order).
__device__ void sum_parts_pairs(const float* partial, int parts, int c0, int c1, float* out0, float* out1) {
    const int lane = threadIdx.x % 32;
    reduce_channel_parts(partial, parts, c0, c1, [&](int c, const float(&v)[PARTS_PER_LANE][2]) {
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < PARTS_PER_LANE; i++) {
            s0 += v[i][0];
            s1 += v[i][1];
        }
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (lane == 0) {
            out0[c] = s0;
            out1[c] = s1;
        }
    });
}
