// common.cuh: helpers shared by every kernel file (inlined into each source by mnist_cuda/cuda.py).
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
    __syncthreads();  // partial[] may still be read by a previous call
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

// Several models stepped by one launch (mnist_cuda/nets/models_net.py): the grid's z is the model (for a kernel
// whose z has a use of its own, z = model * z_per_model + that use), and every buffer holds the models' parts
// one after another: a kernel moves each pointer to its model's part. Activations and scratch find their part's
// size from the sizes they already take; the parameters and gradients (param_stride floats apart) and the running
// statistics (running_stride) from arguments. With one model z is 0 and every offset 0: a single-model launch
// computes what it did, bit for bit.
// Each source compiles twice (mnist_cuda/cuda.py, Source.models_variant): with MODEL_INDEX for launches of
// several models, and without it for one model, where the model is the constant 0 and every offset folds away,
// so a single model's kernels are the code they were before models were counted (no registers, no division).
#if defined(MODEL_INDEX)
__device__ __forceinline__ int model_index(int z_per_model = 1) { return blockIdx.z / z_per_model; }
__device__ __forceinline__ int model_z(int z_per_model) { return blockIdx.z % z_per_model; }  // z's own use
__device__ __forceinline__ int model_of(int i, int per_model) { return i / per_model; }       // by item index
#else
__device__ __forceinline__ int model_index(int = 1) { return 0; }
__device__ __forceinline__ int model_z(int) { return blockIdx.z; }
__device__ __forceinline__ int model_of(int, int) { return 0; }
#endif
template <class T>
__device__ __forceinline__ T* model_part(T* p, size_t per_model, int model) {
    return p + per_model * (size_t)model;
}

// Activations stored as bf16 between stages (--precision bf16: conv2's input and output, fc1's input, and their
// gradients, as torch.autocast stores them): a bfloat16 is the upper 16 bits of a float32, rounded to the
// nearest (ties to even, as the products' pack_bf16) when stored and exact when read. load_value, load_pair,
// store_value and store_pair read and write either type, so one kernel body serves both.
struct bfloat16 {
    unsigned short bits;
};
__device__ __forceinline__ float load_value(const float* p) { return *p; }
__device__ __forceinline__ float load_value(const bfloat16* p) { return __uint_as_float((unsigned)p->bits << 16); }
// p[0], p[1] (p 8-byte aligned for float, 4-byte for bfloat16)
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_pair(const bfloat16* p) {
    const unsigned v = *reinterpret_cast<const unsigned*>(p);  // p[0] in the low half
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
__device__ __forceinline__ void store_value(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_value(bfloat16* p, float v) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(p->bits) : "f"(v));
}
__device__ __forceinline__ void store_pair(float* p, float first, float second) {
    *reinterpret_cast<float2*>(p) = make_float2(first, second);
}
__device__ __forceinline__ void store_pair(bfloat16* p, float first, float second) {
    unsigned v;  // cvt's first operand goes to the high half
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(second), "f"(first));
    *reinterpret_cast<unsigned*>(p) = v;
}
// store_pair(p, v.x, v.y), returning the values stored as load_pair reads them back: v itself for float, v rounded
// to bf16 for bfloat16 (one conversion for both the store and the values).
__device__ __forceinline__ float2 store_pair_stored(float* p, float2 v) {
    store_pair(p, v.x, v.y);
    return v;
}
__device__ __forceinline__ float2 store_pair_stored(bfloat16* p, float2 v) {
    unsigned r;  // cvt's first operand goes to the high half
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v.y), "f"(v.x));
    *reinterpret_cast<unsigned*>(p) = r;
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}

// The input images arrive on the GPU as MNIST's bytes (a quarter of the float32 copy); the network sees
// (x/255 - MNIST_MEAN) / MNIST_STD in float32, the same operations as mnist_cuda.data.normalize, so the
// same bits (IEEE division; a test checks all 256 values).
// MNIST_MEAN and MNIST_STD come from mnist_cuda.data (NVRTC -D options set by mnist_cuda/ops).
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
__device__ __forceinline__ void batchnorm_finalize(int c, float mean, float var, float count, float eps, float momentum,
                                                   float* save_mean, float* save_invstd, float* running_mean,
                                                   float* running_var) {
    const float invstd = rsqrtf(var + eps);
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    const float unbiased = count > 1.0f ? var * count / (count - 1.0f) : var;
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
}

// ReLU that lets NaN through, as PyTorch's does (fmaxf(NaN, 0) would return 0 and hide a divergence).
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

// A pooled window's position as the blocks' backward kernels read it: the position 0..3, or NO_POSITION
// (from mnist_cuda/ops/common.py, an NVRTC -D option) where the ReLU blocked the window (pooled value not
// positive, or NaN), so that they need not read the pooled value.
#if !defined(NO_POSITION)
#error "compile through mnist_cuda.ops, which passes NO_POSITION as a -D option"
#endif
__device__ __forceinline__ unsigned char pool_position(float pooled, int at) {
    return pooled > 0.0f ? (unsigned char)at : (unsigned char)NO_POSITION;
}

// relu_max4 (below) where no value is NaN and their sum does not overflow: its fast path alone.
__device__ __forceinline__ float relu_max4_finite(float top_left, float top_right, float bottom_left,
                                                  float bottom_right, int* at) {
    const float v[4] = {top_left, top_right, bottom_left, bottom_right};
    float best = v[0];
    int best_at = 0;
#pragma unroll
    for (int p = 1; p < 4; p++)
        if (v[p] > best) {
            best = v[p];
            best_at = p;
        }
    *at = best > 0.0f ? best_at : 0;
    return best > 0.0f ? best : 0.0f;
}

// relu then 2x2 max pool of four values in window order (0,0),(0,1),(1,0),(1,1): the first maximum
// wins, like PyTorch, and a NaN wins over numbers. Returns the pooled value; *at gets the position 0..3.
// Without a NaN the ReLU commutes with the maximum: the first maximum of the values themselves is the
// first maximum after the ReLU where it is positive, and where it is not every value becomes 0 and
// position 0 wins. That takes three comparisons where the rule as written takes a dozen, and one sum
// tests all four for NaN (a NaN makes it NaN; so do infinities of both signs, given or from overflow, and
// then the rule as written decides, as it would anyway).
__device__ __forceinline__ float relu_max4(float top_left, float top_right, float bottom_left, float bottom_right,
                                           int* at) {
    const float v[4] = {top_left, top_right, bottom_left, bottom_right};
    if (isnan((v[0] + v[1]) + (v[2] + v[3]))) {
        float best = relu(v[0]);
        int best_at = 0;
#pragma unroll
        for (int p = 1; p < 4; p++) {
            const float r = relu(v[p]);
            if (r > best || (isnan(r) && !isnan(best))) {
                best = r;
                best_at = p;
            }
        }
        *at = best_at;
        return best;
    }
    return relu_max4_finite(top_left, top_right, bottom_left, bottom_right, at);
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
