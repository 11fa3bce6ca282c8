// common.cuh: helpers shared by every kernel file (textually inlined by mnist_cuda/kernels.py).
//
// Conventions for all kernels:
//  - tensors are dense float32 in PyTorch's NCHW layout; integer arguments are 32-bit (launch with
//    np.int32: a Python int would be passed as 64 bits and shift every later argument);
//  - no atomics on floats: every reduction has a fixed order, so training is bit-for-bit repeatable.
#pragma once

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

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
    __syncthreads();                      // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// The last-block idiom. Each of `blocks` blocks that share a counter writes its partial result, then
// calls this; exactly one block, the last to finish, gets true and combines all partials in a fixed
// order (so the result does not depend on which block happened to finish last: still deterministic).
// Only the integer counter uses an atomic. The last block resets it to 0, ready for the next launch or
// graph replay. Every thread of the block must call it. Read other blocks' partials with __ldcg (from
// L2). The reductions over the batch give each row of blocks (blockIdx.y: a group of channels) its own
// counter, so each group's last block merges only that group, and the groups merge in parallel.
__device__ __forceinline__ bool last_block_done(unsigned int* counter, unsigned int blocks) {
    __shared__ bool is_last;
    __threadfence();  // this thread's partial writes are visible device-wide before we count
    __syncthreads();
    if (threadIdx.x == 0) {
        is_last = atomicAdd(counter, 1u) == blocks - 1;
        if (is_last) *counter = 0u;
    }
    __syncthreads();
    if (is_last) __threadfence();
    return is_last;
}

// The input images arrive on the GPU as MNIST's bytes (a quarter of the float32 copy); the network sees
// (x/255 - MNIST_MEAN) / MNIST_STD in float32, the same operations as mnist_cuda.data.normalize, so the
// same bits (IEEE division; a test checks all 256 values).
#define MNIST_MEAN 0.1307f
#define MNIST_STD 0.3081f
__device__ __forceinline__ float normalize_pixel(unsigned char v) {
    return ((float)v / 255.0f - MNIST_MEAN) / MNIST_STD;
}

// BatchNorm's output for one element, in the same order of operations as PyTorch and the reference.
// (The cheaper x*scale + shift rounds differently, and on MNIST that matters: a channel's uniform
// background can sit within rounding of zero, and then the ReLU after it flips for a whole region.)
__device__ __forceinline__ float batchnorm_apply(float x, float mean, float invstd, float gamma, float beta) {
    return (x - mean) * invstd * gamma + beta;
}

// BatchNorm's training statistics of channel c are known: save the mean and 1/std (forward's
// normalisation and backward's xhat) and apply PyTorch's running-statistics update.
__device__ __forceinline__ void batchnorm_finalize(int c, float mean, float var, float count, float eps,
                                                   float momentum, float* save_mean, float* save_invstd,
                                                   float* running_mean, float* running_var) {
    const float invstd = rsqrtf(var + eps);
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    const float unbiased = count > 1.0f ? var * count / (count - 1.0f) : var;
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
}

// ReLU that lets NaN through, as PyTorch's does (fmaxf(NaN, 0) would return 0 and hide a divergence).
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

// relu then 2x2 max pool of four values in window order (0,0),(0,1),(1,0),(1,1): the first maximum
// wins, like PyTorch, and a NaN wins over numbers. Returns the pooled value; *at gets the position 0..3.
__device__ __forceinline__ float relu_max4(float v0, float v1, float v2, float v3, int* at) {
    const float r[4] = {relu(v0), relu(v1), relu(v2), relu(v3)};
    float best = r[0];
    int best_at = 0;
#pragma unroll
    for (int p = 1; p < 4; p++)
        if (r[p] > best || (isnan(r[p]) && !isnan(best))) { best = r[p]; best_at = p; }
    *at = best_at;
    return best;
}

// Chan et al.'s merge of two sets' (mean, M2 = sum of squared deviations, count): (mean, m2, n)
// becomes the statistics of both. Stable, because each set's deviations were taken from its own mean.
__device__ __forceinline__ void chan_merge(float* mean, float* m2, float* n, float mean_b, float m2_b, float n_b) {
    if (n_b == 0.0f) return;
    const float total = *n + n_b, delta = mean_b - *mean, f = n_b / total;
    *mean += delta * f;
    *m2 += m2_b + delta * delta * *n * f;
    *n = total;
}

// sum over b < count of p[b * stride], added in the order b = 0, 1, ... (deterministic). The loads go
// out SUM_BATCH at a time so that their latencies overlap: a loop that adds one load at a time waits
// for each in turn (about half a microsecond apiece from L2), and that made the last-block reductions
// the slowest part of their kernels at small batches.
#define SUM_BATCH 32
template <class T>
__device__ __forceinline__ T sum_in_order(const T* p, int count, size_t stride) {
    T s = 0;
    for (int b0 = 0; b0 < count; b0 += SUM_BATCH) {
        T v[SUM_BATCH];
#pragma unroll
        for (int j = 0; j < SUM_BATCH; j++) v[j] = b0 + j < count ? __ldcg(p + (size_t)(b0 + j) * stride) : T(0);
#pragma unroll
        for (int j = 0; j < SUM_BATCH; j++)
            if (b0 + j < count) s += v[j];
    }
    return s;
}

// Where block b of a per-part reduction puts its pair (or pairs) for channel c: partial [C, parts, 2],
// a channel's parts side by side, so that the warp merging the channel reads them coalesced.
__device__ __forceinline__ float* part_pair(float* partial, int c, int parts, int b) {
    return partial + ((size_t)c * parts + b) * 2;
}

// In the last block of a channel group: hand each channel c in [c0, c1)'s per-part pairs (parts <=
// MAX_PARTS) to reduce(c, v), called by every lane of the warp that owns c; lane l holds parts l, l + 32,
// ... in v[0], v[1], ... (zeros past the end), loaded as float2.
#define MAX_PARTS 64  // mirrors mnist_cuda.kernels.MAX_PARTS
#define PARTS_PER_LANE (MAX_PARTS / 32)
template <class Reduce>
__device__ __forceinline__ void reduce_channel_parts(const float* partial, int parts, int c0, int c1, Reduce reduce) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int c = c0 + threadIdx.x / 32; c < c1; c += warps) {
        float v[PARTS_PER_LANE][2];
#pragma unroll
        for (int i = 0; i < PARTS_PER_LANE; i++) {
            const int b = lane + 32 * i;
            const float2 pair = b < parts ? __ldcg(reinterpret_cast<const float2*>(partial) + (size_t)c * parts + b)
                                          : make_float2(0.0f, 0.0f);
            v[i][0] = pair.x;
            v[i][1] = pair.y;
        }
        reduce(c, v);
    }
}

// In the last block of channel group [c0, c1): BatchNorm statistics per channel from per-(channel, part)
// pairs (mean, M2) in partial [C, parts, 2]; part b holds images [b*imgs_per_block, ...) of hw values
// each. This is the parallel form of Chan et al.'s merge: mean = sum(n_b mean_b) / n, M2 = sum(M2_b +
// n_b (mean_b - mean)^2), stable because each part's deviations were taken from its own mean. Then
// batchnorm_finalize, by thread c - c0 for channel c: the warps leave (mean, variance) in save_mean and
// save_invstd first. (Done by the warp that merged the channel, each channel's read of its running
// statistics waited for the previous channel's writes, which it may alias: a memory latency per channel.)
__device__ void batchnorm_merge_finalize(const float* partial, int parts, int imgs_per_block, int N, int hw,
                                         int c0, int c1, float eps, float momentum, float* save_mean,
                                         float* save_invstd, float* running_mean, float* running_var) {
    const int lane = threadIdx.x % 32;
    const float total = (float)N * hw;
    reduce_channel_parts(partial, parts, c0, c1, [&](int c, const float (&v)[PARTS_PER_LANE][2]) {
        float n_b[PARTS_PER_LANE], s = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < PARTS_PER_LANE; i++) {
            const int b = lane + 32 * i;
            n_b[i] = b < parts ? (float)(min(N, (b + 1) * imgs_per_block) - b * imgs_per_block) * hw : 0.0f;
            s += n_b[i] * v[i][0];
        }
        const float mean = warp_sum(s) / total;
#pragma unroll
        for (int i = 0; i < PARTS_PER_LANE; i++) q += v[i][1] + n_b[i] * (v[i][0] - mean) * (v[i][0] - mean);
        const float m2 = warp_sum(q);
        if (lane == 0) {
            save_mean[c] = mean;
            save_invstd[c] = m2 / total;  // the variance, until the finalize below
        }
    });
    __syncthreads();  // (a block sees its own global writes after a barrier)
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        batchnorm_finalize(c, save_mean[c], save_invstd[c], total, eps, momentum, save_mean, save_invstd,
                           running_mean, running_var);
}

// In the last block of channel group [c0, c1): out0[c] = sum_b partial[c, b, 0], out1[c] = sum_b
// partial[c, b, 1] (fixed order).
__device__ void sum_parts_pairs(const float* partial, int parts, int c0, int c1, float* out0, float* out1) {
    const int lane = threadIdx.x % 32;
    reduce_channel_parts(partial, parts, c0, c1, [&](int c, const float (&v)[PARTS_PER_LANE][2]) {
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
