// conv1_fused.cu: the first block, conv1 (one input channel, 28x28) -> BatchNorm2d -> ReLU -> maxpool,
// fused, for the fast kernel version.
//
// conv1's output a[n,c,h,w] costs 9 multiply-adds from a 3 KB image, yet would be 100 KB per image
// if stored (N*C*784 floats, read and written several times). So it is never stored: each kernel
// below stages the image in shared memory and recomputes a where it needs it, always with the same
// conv1_at(), so every recomputation gives the same bits.
//
//   conv1_bn_stats_fast           batch statistics of a            (training forward, 1st launch)
//   conv1_bn_relu_pool_fast       pooled = maxpool(relu(bn(a)))    (forward, 2nd launch; eval too)
//   conv1_bn_backward_reduce_fast dgamma, dbeta                    (backward, 1st launch)
//   conv1_backward_weight_fast    dw, through BN's input gradient (backward, 2nd launch)
//
// Layout: one block per (group of images, 8 channels), one warp per channel; a block handles
// imgs_per_block consecutive images so that there are at most ~64 partial results to combine.
#include "common.cuh"

#define S1 28          // conv1's input and output size
#define P1 (S1 + 2)    // with the zero padding
#define POOLED1 (S1 / 2)
#define WARPS 8

// Stage image n of x [N,1,28,28] in shared memory with a zero border.
__device__ __forceinline__ void load_padded_image(const float* x, int n, float* img) {
    for (int i = threadIdx.x; i < P1 * P1; i += blockDim.x) {
        const int row = i / P1 - 1, col = i % P1 - 1;
        img[i] = (row >= 0 && row < S1 && col >= 0 && col < S1) ? x[n * S1 * S1 + row * S1 + col] : 0.0f;
    }
}

// conv1 output at (h, w) for one channel's 9 weights; taps in a fixed order.
__device__ __forceinline__ float conv1_at(const float* img, int row, int col, const float* w9) {
    const float* p = img + row * P1 + col;  // top-left of the 3x3 window in padded coordinates
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < 3; i++)
#pragma unroll
        for (int j = 0; j < 3; j++) a = fmaf(p[i * P1 + j], w9[i * 3 + j], a);
    return a;
}

__device__ __forceinline__ void load_weights(const float* w, int c, float* w9) {
#pragma unroll
    for (int t = 0; t < 9; t++) w9[t] = w[c * 9 + t];
}

// Stage what the backward needs of image n's pooled outputs, for the block's channels c0..c0+7:
// dz[cl][t], the gradient reaching pooled pixel t's window, and at[cl][t], the window position it
// reaches (its argmax), or NO_POSITION where the ReLU blocked it (pooled <= 0). All threads load
// together, coalesced: one memory latency per image instead of one per pixel.
#define NO_POSITION 4
__device__ __forceinline__ void load_pooled_grad(const float* d_pooled, const float* pooled,
                                                 const unsigned char* argmax, int n, int C, int c0,
                                                 float dz[WARPS][POOLED1 * POOLED1],
                                                 unsigned char at[WARPS][POOLED1 * POOLED1]) {
    for (int i = threadIdx.x; i < WARPS * POOLED1 * POOLED1; i += blockDim.x) {
        const int cl = i / (POOLED1 * POOLED1), t = i % (POOLED1 * POOLED1);
        if (c0 + cl >= C) break;
        const int idx = (n * C + c0 + cl) * POOLED1 * POOLED1 + t;
        const bool passed = pooled[idx] > 0.0f;
        dz[cl][t] = passed ? d_pooled[idx] : 0.0f;
        at[cl][t] = passed ? argmax[idx] : NO_POSITION;
    }
}

// The images of block part b: [first, last).
__device__ __forceinline__ void part_images(int b, int imgs_per_block, int N, int* first, int* last) {
    *first = b * imgs_per_block;
    *last = min(N, *first + imgs_per_block);
}

// Per (part, channel): mean and M2 of conv1's output over the part's images. Each image is staged
// once; its mean and squared deviations from that mean are two passes over shared memory, merged
// into the part's running (mean, M2) with Chan's formula, in image order. The last block merges the
// parts and finalizes BatchNorm (mean, invstd and the running statistics).
// grid (parts, ceil(C/8)), 256 threads; partial [parts, C, 2].
extern "C" __global__ void __launch_bounds__(256)
conv1_bn_stats_fast(const float* x, const float* w, int N, int C, int imgs_per_block, float* partial,
                    unsigned int* counter, float eps, float momentum, float* save_mean, float* save_invstd,
                    float* running_mean, float* running_var) {
    __shared__ float img[P1 * P1];
    const int lane = threadIdx.x % 32, c = blockIdx.y * WARPS + threadIdx.x / 32;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    float w9[9];
    if (c < C) load_weights(w, c, w9);
    float mean = 0.0f, m2 = 0.0f, count = 0.0f;  // over the part's images so far
    for (int n = first; n < last; n++) {
        __syncthreads();
        load_padded_image(x, n, img);
        __syncthreads();
        if (c >= C) continue;
        float sum = 0.0f;
        for (int p = lane; p < S1 * S1; p += 32) sum += conv1_at(img, p / S1, p % S1, w9);
        const float image_mean = warp_sum(sum) / (S1 * S1);
        float sq = 0.0f;
        for (int p = lane; p < S1 * S1; p += 32) {
            const float d = conv1_at(img, p / S1, p % S1, w9) - image_mean;
            sq += d * d;
        }
        const float image_m2 = warp_sum(sq), total = count + S1 * S1, delta = image_mean - mean;
        mean += delta * (S1 * S1) / total;
        m2 += image_m2 + delta * delta * count * (S1 * S1) / total;
        count = total;
    }
    if (c < C && lane == 0) {
        partial[(blockIdx.x * C + c) * 2] = mean;
        partial[(blockIdx.x * C + c) * 2 + 1] = m2;
    }
    if (!last_block_done(counter)) return;
    batchnorm_merge_finalize(partial, gridDim.x, imgs_per_block, N, S1 * S1, C, eps, momentum, save_mean,
                             save_invstd, running_mean, running_var);
}

// pooled[n,c,ph,pw] = max over the 2x2 window of relu(batchnorm(a)), with the window position.
// grid (N, ceil(C/8)), 256 threads: thread t < 196 is pooled pixel t, looping over the block's channels.
extern "C" __global__ void __launch_bounds__(256)
conv1_bn_relu_pool_fast(const float* x, const float* w, const float* mean, const float* invstd, const float* gamma,
                        const float* beta, int N, int C, float* pooled, unsigned char* argmax) {
    __shared__ float img[P1 * P1];
    const int n = blockIdx.x, t = threadIdx.x;
    load_padded_image(x, n, img);
    __syncthreads();
    if (t >= POOLED1 * POOLED1) return;
    const int row = 2 * (t / POOLED1), col = 2 * (t % POOLED1);
    for (int c = blockIdx.y * WARPS; c < min(C, (blockIdx.y + 1) * WARPS); c++) {
        float w9[9];
        load_weights(w, c, w9);
        const float m = mean[c], is = invstd[c], g = gamma[c], b = beta[c];
        int at;
        const float v = relu_max4(batchnorm_apply(conv1_at(img, row, col, w9), m, is, g, b),
                                  batchnorm_apply(conv1_at(img, row, col + 1, w9), m, is, g, b),
                                  batchnorm_apply(conv1_at(img, row + 1, col, w9), m, is, g, b),
                                  batchnorm_apply(conv1_at(img, row + 1, col + 1, w9), m, is, g, b), &at);
        pooled[(n * C + c) * POOLED1 * POOLED1 + t] = v;
        argmax[(n * C + c) * POOLED1 * POOLED1 + t] = (unsigned char)at;
    }
}

// dbeta[c] = sum dz, dgamma[c] = sum dz * xhat over the batch, where dz (the gradient at BN's output)
// is nonzero only at each window's argmax, and only where the ReLU passed (pooled > 0). So the sums
// run over pooled pixels, recomputing conv1 at the argmax only. grid (parts, ceil(C/8)), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
conv1_bn_backward_reduce_fast(const float* x, const float* w, const float* save_mean, const float* save_invstd,
                              const float* d_pooled, const float* pooled, const unsigned char* argmax, int N,
                              int C, int imgs_per_block, float* partial, unsigned int* counter, float* dgamma,
                              float* dbeta) {
    __shared__ float img[P1 * P1];
    __shared__ float dz[WARPS][POOLED1 * POOLED1];
    __shared__ unsigned char at[WARPS][POOLED1 * POOLED1];
    const int lane = threadIdx.x % 32, cl = threadIdx.x / 32, c = blockIdx.y * WARPS + cl;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    float w9[9], mean = 0.0f, invstd = 0.0f;
    if (c < C) {
        load_weights(w, c, w9);
        mean = save_mean[c];
        invstd = save_invstd[c];
    }
    float sdz = 0.0f, sdzx = 0.0f;
    for (int n = first; n < last; n++) {
        __syncthreads();
        load_padded_image(x, n, img);
        load_pooled_grad(d_pooled, pooled, argmax, n, C, blockIdx.y * WARPS, dz, at);
        __syncthreads();
        if (c >= C) continue;
        for (int t = lane; t < POOLED1 * POOLED1; t += 32) {
            const int pos = at[cl][t];
            if (pos == NO_POSITION) continue;
            const int row = 2 * (t / POOLED1) + pos / 2, col = 2 * (t % POOLED1) + pos % 2;
            sdz += dz[cl][t];
            sdzx += dz[cl][t] * (conv1_at(img, row, col, w9) - mean) * invstd;
        }
    }
    sdz = warp_sum(sdz);
    sdzx = warp_sum(sdzx);
    if (c < C && lane == 0) {
        partial[(blockIdx.x * C + c) * 2] = sdz;
        partial[(blockIdx.x * C + c) * 2 + 1] = sdzx;
    }
    if (!last_block_done(counter)) return;
    sum_parts_pairs(partial, gridDim.x, C, dbeta, dgamma);
}

// dw[c, tap] = sum over the batch of da[n,c,h,w] * x[n, h+tap/3-1, w+tap%3-1], where BN's input
// gradient da = gamma*invstd/count * (count*dz - dbeta - xhat*dgamma) is recomputed per pixel
// (xhat from conv1_at, dz from the pooled gradient). grid (parts, ceil(C/8)), 256 threads;
// partial [parts, C, 9], summed by the last block.
extern "C" __global__ void __launch_bounds__(256)
conv1_backward_weight_fast(const float* x, const float* w, const float* save_mean, const float* save_invstd,
                           const float* gamma, const float* dgamma, const float* dbeta, const float* d_pooled,
                           const float* pooled, const unsigned char* argmax, int N, int C, int imgs_per_block,
                           float* partial, unsigned int* counter, float* dw) {
    __shared__ float img[P1 * P1];
    __shared__ float dz[WARPS][POOLED1 * POOLED1];
    __shared__ unsigned char at[WARPS][POOLED1 * POOLED1];
    const int lane = threadIdx.x % 32, cl = threadIdx.x / 32, c = blockIdx.y * WARPS + cl;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    const float count = (float)N * S1 * S1;
    float w9[9], mean = 0.0f, invstd = 0.0f, k = 0.0f, db = 0.0f, dg = 0.0f;
    if (c < C) {
        load_weights(w, c, w9);
        mean = save_mean[c];
        invstd = save_invstd[c];
        k = gamma[c] * invstd / count;
        db = dbeta[c];
        dg = dgamma[c];
    }
    float acc[9];
#pragma unroll
    for (int t = 0; t < 9; t++) acc[t] = 0.0f;
    for (int n = first; n < last; n++) {
        __syncthreads();
        load_padded_image(x, n, img);
        load_pooled_grad(d_pooled, pooled, argmax, n, C, blockIdx.y * WARPS, dz, at);
        __syncthreads();
        if (c >= C) continue;
        for (int p = lane; p < S1 * S1; p += 32) {
            const int row = p / S1, col = p % S1, t = (row / 2) * POOLED1 + col / 2;
            const float dz_here = at[cl][t] == (row % 2) * 2 + col % 2 ? dz[cl][t] : 0.0f;
            const float xhat = (conv1_at(img, row, col, w9) - mean) * invstd;
            const float da = k * (count * dz_here - db - xhat * dg);
            const float* patch = img + row * P1 + col;
#pragma unroll
            for (int t = 0; t < 9; t++) acc[t] = fmaf(da, patch[(t / 3) * P1 + t % 3], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < 9; t++) {
        const float s = warp_sum(acc[t]);
        if (c < C && lane == 0) partial[(blockIdx.x * C + c) * 9 + t] = s;
    }
    if (!last_block_done(counter)) return;
    for (int i = threadIdx.x; i < C * 9; i += blockDim.x) {
        float s = 0.0f;
#pragma unroll 8  // independent loads in flight together
        for (int b = 0; b < gridDim.x; b++) s += __ldcg(&partial[b * C * 9 + i]);
        dw[i] = s;
    }
}
