// conv1_fused.cu: the first block, conv1 (one input channel, 28x28) -> BatchNorm2d -> ReLU -> maxpool,
// fused, for the fast kernel version.
//
// conv1's output a[n,c,h,w] costs 9 multiply-adds from a 3 KB image, yet would be 100 KB per image
// if stored (N*C*784 floats, read and written several times). So it is never stored: each kernel
// below stages the image in shared memory and recomputes a where it needs it, always with the same
// conv1_window(), so every recomputation gives the same bits.
//
//   conv1_bn_stats_fast           batch statistics of a            (training forward, 1st launch)
//   conv1_bn_relu_pool_fast       pooled = maxpool(relu(bn(a)))    (forward, 2nd launch; eval too)
//   conv1_bn_backward_reduce_fast dgamma, dbeta                    (backward, 1st launch)
//   conv1_backward_weight_fast    dw, through BN's input gradient (backward, 2nd launch)
//
// Layout: a block handles CHANNELS channels; thread t < 196 owns pooled window t, i.e. the 2x2
// outputs under it. It copies the 4x4 input patch those four outputs read into registers (eight
// float2 loads), then computes the four outputs of each channel from registers: 36 multiply-adds
// per 8 shared-memory loads, where one output at a time would need 9 loads for 9 multiply-adds.
// The images come as bytes and are normalised as they are staged (normalize_pixel, common.cuh, by a
// table of the 256 values in shared memory).
// The reductions (statistics, backward) give each block a part of the batch (imgs_per_block images),
// sum inside the block in a fixed order, and let the last block of each channel group combine the parts.
#include "common.cuh"

#define S1 28                      // conv1's input and output size
#define P1 (S1 + 2)                // with the zero padding
#define POOLED1 (S1 / 2)
#define WINDOWS (POOLED1 * POOLED1)  // 196 pooled windows per image and channel
#define CHANNELS 8                 // channels per block
#define WEIGHT_CHANNELS 4          // channels per block of conv1_backward_weight_fast
#define THREADS 224                // 7 warps; threads 196..223 own no window but join the reductions
#define NO_POSITION 4              // "the ReLU blocked this window": no gradient reaches conv1

// Element i of the zero-padded P1 x P1 image: inside the 28x28 image (then *pixel is its index there)
// or in the padding.
__device__ __forceinline__ bool padded_pixel(int i, int* pixel) {
    const int row = i / P1 - 1, col = i % P1 - 1;
    *pixel = row * S1 + col;
    return i < P1 * P1 && row >= 0 && row < S1 && col >= 0 && col < S1;
}

// This thread's pixels of image n of x [N,1,28,28] (bytes) into registers (the loads are issued here;
// only a use of v waits for them). Blocks have THREADS threads.
#define IMAGE_REGS CEIL_DIV(P1 * P1, THREADS)
__device__ __forceinline__ void fetch_padded_image(const unsigned char* x, int n, unsigned char v[IMAGE_REGS]) {
#pragma unroll
    for (int r = 0; r < IMAGE_REGS; r++) {
        int pixel;
        v[r] = padded_pixel(threadIdx.x + r * THREADS, &pixel) ? x[n * S1 * S1 + pixel] : 0;
    }
}

// ... then normalised (pixel_value[byte]) into the block's shared copy, zero-padded to P1 x P1 (the
// padding pads the normalised image, so it stays 0).
__device__ __forceinline__ void store_padded_image(const unsigned char v[IMAGE_REGS], const float* pixel_value,
                                                   float* img) {
#pragma unroll
    for (int r = 0; r < IMAGE_REGS; r++) {
        const int i = threadIdx.x + r * THREADS;
        int pixel;
        if (i < P1 * P1) img[i] = padded_pixel(i, &pixel) ? pixel_value[v[r]] : 0.0f;
    }
}

// Stage the block's channel weights c0.., 12 floats per channel (9 used) so that a channel's weights
// are three float4 loads (broadcast: every thread reads the same address).
__device__ __forceinline__ void load_channel_weights(const float* w, int C, int c0, float4 ws[CHANNELS][3]) {
    float* flat = reinterpret_cast<float*>(ws);
    for (int i = threadIdx.x; i < CHANNELS * 12; i += blockDim.x) {
        const int cl = i / 12, tap = i % 12;
        flat[i] = (c0 + cl < C && tap < 9) ? w[(c0 + cl) * 9 + tap] : 0.0f;
    }
}

// The 4x4 input patch under pooled window t: padded rows 2*ph .. 2*ph+3, columns 2*pw .. 2*pw+3.
// Every row offset is even, so the patch is eight aligned float2 loads (img is 8-byte aligned).
__device__ __forceinline__ void load_patch(const float* img, int t, float p[4][4]) {
    const float* base = img + 2 * (t / POOLED1) * P1 + 2 * (t % POOLED1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 left = *reinterpret_cast<const float2*>(base + i * P1);
        const float2 right = *reinterpret_cast<const float2*>(base + i * P1 + 2);
        p[i][0] = left.x;
        p[i][1] = left.y;
        p[i][2] = right.x;
        p[i][3] = right.y;
    }
}

// The loop over images [first, last) that every kernel here runs: body(n, p) is called by each thread
// t < WINDOWS with its patch p of image n. The images pass through two shared-memory buffers: while
// the block computes image n from one, image n+1 is on its way from global memory into registers, and
// goes to the other buffer afterwards. One barrier per image, and the loads of the next image overlap
// the work on this one.
template <class Body>
__device__ __forceinline__ void for_each_image(const unsigned char* x, int first, int last, float img[2][P1 * P1],
                                               Body body) {
    // normalize_pixel of every byte value, once per block (its two divisions per pixel, in every
    // kernel and channel group, made them up to 38% slower at batch 512)
    __shared__ float pixel_value[256];
    unsigned char next[IMAGE_REGS];
    fetch_padded_image(x, first, next);
    for (int v = threadIdx.x; v < 256; v += blockDim.x) pixel_value[v] = normalize_pixel((unsigned char)v);
    __syncthreads();
    store_padded_image(next, pixel_value, img[0]);
    __syncthreads();
    for (int n = first; n < last; n++) {
        if (n + 1 < last) fetch_padded_image(x, n + 1, next);
        if (threadIdx.x < WINDOWS) {
            float p[4][4];
            load_patch(img[(n - first) % 2], threadIdx.x, p);
            body(n, p);
        }
        if (n + 1 < last) store_padded_image(next, pixel_value, img[(n + 1 - first) % 2]);
        __syncthreads();
    }
}

// conv1's four outputs under the window, out[pos] at window position pos = 2*di + dj (the max-pool's
// order), for one channel's weights; taps in a fixed order.
__device__ __forceinline__ void conv1_window(const float p[4][4], const float4 wq[3], float out[4]) {
    const float w9[9] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w, wq[2].x};
#pragma unroll
    for (int pos = 0; pos < 4; pos++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 3; i++)
#pragma unroll
            for (int j = 0; j < 3; j++) a = fmaf(p[pos / 2 + i][pos % 2 + j], w9[i * 3 + j], a);
        out[pos] = a;
    }
}

// The value at window position `at` of out[4] (registers cannot be indexed by a runtime value).
__device__ __forceinline__ float select4(const float out[4], int at) {
    return at == 0 ? out[0] : at == 1 ? out[1] : at == 2 ? out[2] : out[3];
}

// What reaches pooled window idx from above: the gradient dz at its argmax position `at`, or
// at = NO_POSITION where the ReLU blocked it (pooled <= 0). The three loads go out together.
__device__ __forceinline__ void pooled_grad(const float* d_pooled, const float* pooled, const unsigned char* argmax,
                                            int idx, float* dz, int* at) {
    const float value = pooled[idx], grad = d_pooled[idx];
    const int position = argmax[idx];
    *dz = value > 0.0f ? grad : 0.0f;
    *at = value > 0.0f ? position : NO_POSITION;
}

// The images of block part b: [first, last).
__device__ __forceinline__ void part_images(int b, int imgs_per_block, int N, int* first, int* last) {
    *first = b * imgs_per_block;
    *last = min(N, *first + imgs_per_block);
}

// Each of the K values v[k] summed over the block in a fixed order (warp butterflies, then the warps
// in order); thread k < K returns total k, the others 0. red: K * (blockDim.x / 32) floats.
template <int K>
__device__ __forceinline__ float block_sums(const float (&v)[K], float* red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const float s = warp_sum(v[k]);
        if (lane == 0) red[warp * K + k] = s;
    }
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x < K)
        for (int w = 0; w < warps; w++) total += red[w * K + threadIdx.x];
    return total;
}

// Per (channel, part): mean and M2 of conv1's output over the part's images. Each thread keeps the
// running (mean, M2, count) of its own window, adding each image's four outputs with Chan's merge;
// the block merges its threads in a fixed order. For each group of CHANNELS channels, the last of its
// blocks merges the parts and finalizes BatchNorm (mean, invstd and the running statistics).
// grid (parts, ceil(C/CHANNELS)), THREADS threads; partial [C, parts, 2]; counter: one per group.
extern "C" __global__ void __launch_bounds__(THREADS)
conv1_bn_stats_fast(const unsigned char* x, const float* w, int N, int C, int imgs_per_block, float* partial,
                    unsigned int* counter, float eps, float momentum, float* save_mean, float* save_invstd,
                    float* running_mean, float* running_var) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    __shared__ float red[THREADS / 32][CHANNELS][3];  // per warp: mean, M2, count
    const int t = threadIdx.x, c0 = blockIdx.y * CHANNELS, lane = t % 32, warp = t / 32;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    load_channel_weights(w, C, c0, ws);
    float mean[CHANNELS], m2[CHANNELS], count = 0.0f;
#pragma unroll
    for (int cl = 0; cl < CHANNELS; cl++) mean[cl] = m2[cl] = 0.0f;
    for_each_image(x, first, last, img, [&](int n, const float (&p)[4][4]) {
#pragma unroll
        for (int cl = 0; cl < CHANNELS; cl++) {
            float a[4], n_cl = count;
            conv1_window(p, ws[cl], a);
            const float m = (a[0] + a[1] + a[2] + a[3]) * 0.25f;  // this image's four outputs: two passes
            const float q = (a[0] - m) * (a[0] - m) + (a[1] - m) * (a[1] - m) + (a[2] - m) * (a[2] - m) +
                            (a[3] - m) * (a[3] - m);
            chan_merge(&mean[cl], &m2[cl], &n_cl, m, q, 4.0f);
        }
        count += 4.0f;
    });
    // merge the threads' statistics, by the parallel form of Chan's merge (see batchnorm_merge_finalize):
    // in each warp by butterflies, then the block's warps in order by thread cl
    const float n_warp = warp_sum(count);
#pragma unroll
    for (int cl = 0; cl < CHANNELS; cl++) {
        const float mean_warp = warp_sum(count * mean[cl]) / n_warp;
        const float m2_warp = warp_sum(m2[cl] + count * (mean[cl] - mean_warp) * (mean[cl] - mean_warp));
        if (lane == 0) {
            red[warp][cl][0] = mean_warp;
            red[warp][cl][1] = m2_warp;
            red[warp][cl][2] = n_warp;
        }
    }
    __syncthreads();
    const int c = c0 + t;
    if (t < CHANNELS && c < C) {
        float s = 0.0f, n = 0.0f, q = 0.0f;
        for (int v = 0; v < THREADS / 32; v++) {
            s += red[v][t][2] * red[v][t][0];
            n += red[v][t][2];
        }
        const float mean_all = s / n;
        for (int v = 0; v < THREADS / 32; v++) {
            const float d = red[v][t][0] - mean_all;
            q += red[v][t][1] + red[v][t][2] * d * d;
        }
        float* pair = part_pair(partial, c, gridDim.x, blockIdx.x);
        pair[0] = mean_all;
        pair[1] = q;
    }
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    batchnorm_merge_finalize(partial, gridDim.x, imgs_per_block, N, S1 * S1, c0, min(C, c0 + CHANNELS), eps,
                             momentum, save_mean, save_invstd, running_mean, running_var);
}

// pooled[n,c,ph,pw] = max over the 2x2 window of relu(batchnorm(a)), with the window position.
// grid (N, ceil(C/CHANNELS)), THREADS threads: thread t < 196 is pooled window t of image n.
extern "C" __global__ void __launch_bounds__(THREADS)
conv1_bn_relu_pool_fast(const unsigned char* x, const float* w, const float* mean, const float* invstd,
                        const float* gamma, const float* beta, int N, int C, float* pooled, unsigned char* argmax) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    const int c0 = blockIdx.y * CHANNELS;
    load_channel_weights(w, C, c0, ws);
    for_each_image(x, blockIdx.x, blockIdx.x + 1, img, [&](int n, const float (&p)[4][4]) {
        const int t = threadIdx.x;
#pragma unroll
        for (int cl = 0; cl < CHANNELS; cl++) {
            const int c = c0 + cl;
            if (c >= C) break;
            float a[4];
            conv1_window(p, ws[cl], a);
            const float m = mean[c], is = invstd[c], g = gamma[c], b = beta[c];
            int at;
            const float v = relu_max4(batchnorm_apply(a[0], m, is, g, b), batchnorm_apply(a[1], m, is, g, b),
                                      batchnorm_apply(a[2], m, is, g, b), batchnorm_apply(a[3], m, is, g, b), &at);
            pooled[(n * C + c) * WINDOWS + t] = v;
            argmax[(n * C + c) * WINDOWS + t] = (unsigned char)at;
        }
    });
}

// dbeta[c] = sum dz, dgamma[c] = sum dz * xhat over the batch, where dz (the gradient at BN's output)
// is nonzero only at each window's argmax, and only where the ReLU passed (pooled > 0): one term per
// window at most. grid (parts, ceil(C/CHANNELS)), THREADS threads; partial [C, parts, 2]; counter: one
// per group of CHANNELS channels.
extern "C" __global__ void __launch_bounds__(THREADS)
conv1_bn_backward_reduce_fast(const unsigned char* x, const float* w, const float* save_mean, const float* save_invstd,
                              const float* d_pooled, const float* pooled, const unsigned char* argmax, int N,
                              int C, int imgs_per_block, float* partial, unsigned int* counter, float* dgamma,
                              float* dbeta) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    __shared__ float red[THREADS / 32 * CHANNELS * 2];
    __shared__ float mean[CHANNELS], invstd[CHANNELS];
    const int t = threadIdx.x, c0 = blockIdx.y * CHANNELS;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    load_channel_weights(w, C, c0, ws);
    if (t < CHANNELS && c0 + t < C) {
        mean[t] = save_mean[c0 + t];
        invstd[t] = save_invstd[c0 + t];
    }
    float sums[2 * CHANNELS];  // sum dz, then sum dz*xhat, of each channel
#pragma unroll
    for (int i = 0; i < 2 * CHANNELS; i++) sums[i] = 0.0f;
    for_each_image(x, first, last, img, [&](int n, const float (&p)[4][4]) {
        float dz[CHANNELS];
        int at[CHANNELS];
#pragma unroll
        for (int cl = 0; cl < CHANNELS; cl++) {  // every channel's loads first: one memory latency
            at[cl] = NO_POSITION;
            if (c0 + cl < C) pooled_grad(d_pooled, pooled, argmax, (n * C + c0 + cl) * WINDOWS + t, &dz[cl], &at[cl]);
        }
#pragma unroll
        for (int cl = 0; cl < CHANNELS; cl++) {
            if (at[cl] == NO_POSITION) continue;  // (also every channel past C)
            float a[4];
            conv1_window(p, ws[cl], a);
            sums[cl] += dz[cl];
            sums[CHANNELS + cl] += dz[cl] * (select4(a, at[cl]) - mean[cl]) * invstd[cl];
        }
    });
    const float total = block_sums(sums, red);
    const int c = c0 + t % CHANNELS;
    if (t < 2 * CHANNELS && c < C) part_pair(partial, c, gridDim.x, blockIdx.x)[t / CHANNELS] = total;
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    sum_parts_pairs(partial, gridDim.x, c0, min(C, c0 + CHANNELS), dbeta, dgamma);
}

// dw[c, tap] = sum over the batch of da[n,c,h,w] * x[n, h+tap/3-1, w+tap%3-1], where BN's input
// gradient da = gamma*invstd/count * (count*dz - dbeta - xhat*dgamma) is recomputed per output
// (xhat from conv1_window, dz from the pooled gradient). Each thread adds its window's four outputs
// times its patch into 9 sums per channel, for WEIGHT_CHANNELS channels (36 sums: with CHANNELS, the
// 72 sums would need more registers than two blocks per SM allow). grid (parts, ceil(C/WEIGHT_CHANNELS)),
// THREADS threads; partial [parts, C, 9], summed by the last block of each group of WEIGHT_CHANNELS
// channels (counter: one per group).
extern "C" __global__ void __launch_bounds__(THREADS)
conv1_backward_weight_fast(const unsigned char* x, const float* w, const float* save_mean, const float* save_invstd,
                           const float* gamma, const float* dgamma, const float* dbeta, const float* d_pooled,
                           const float* pooled, const unsigned char* argmax, int N, int C, int imgs_per_block,
                           float* partial, unsigned int* counter, float* dw) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    __shared__ float red[THREADS / 32 * WEIGHT_CHANNELS * 9];
    __shared__ float mean[WEIGHT_CHANNELS], invstd[WEIGHT_CHANNELS], k[WEIGHT_CHANNELS], db[WEIGHT_CHANNELS],
        dg[WEIGHT_CHANNELS];
    const int t = threadIdx.x, c0 = blockIdx.y * WEIGHT_CHANNELS;
    const float count = (float)N * S1 * S1;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    load_channel_weights(w, C, c0, ws);
    if (t < WEIGHT_CHANNELS && c0 + t < C) {
        const int c = c0 + t;
        mean[t] = save_mean[c];
        invstd[t] = save_invstd[c];
        k[t] = gamma[c] * save_invstd[c] / count;
        db[t] = dbeta[c];
        dg[t] = dgamma[c];
    }
    float acc[WEIGHT_CHANNELS * 9];
#pragma unroll
    for (int i = 0; i < WEIGHT_CHANNELS * 9; i++) acc[i] = 0.0f;
    for_each_image(x, first, last, img, [&](int n, const float (&p)[4][4]) {
#pragma unroll
        for (int cl = 0; cl < WEIGHT_CHANNELS; cl++) {
            if (c0 + cl >= C) break;
            float dz, a[4];
            int at;
            pooled_grad(d_pooled, pooled, argmax, (n * C + c0 + cl) * WINDOWS + t, &dz, &at);
            conv1_window(p, ws[cl], a);
#pragma unroll
            for (int pos = 0; pos < 4; pos++) {
                const float xhat = (a[pos] - mean[cl]) * invstd[cl];
                const float da = k[cl] * (count * (pos == at ? dz : 0.0f) - db[cl] - xhat * dg[cl]);
#pragma unroll
                for (int tap = 0; tap < 9; tap++)
                    acc[cl * 9 + tap] = fmaf(da, p[pos / 2 + tap / 3][pos % 2 + tap % 3], acc[cl * 9 + tap]);
            }
        }
    });
    const float total = block_sums(acc, red);
    const int c = c0 + t / 9;
    if (t < WEIGHT_CHANNELS * 9 && c < C) partial[(blockIdx.x * C + c) * 9 + t % 9] = total;
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    for (int i = c0 * 9 + threadIdx.x; i < min(C, c0 + WEIGHT_CHANNELS) * 9; i += blockDim.x)
        dw[i] = sum_in_order(partial + i, gridDim.x, C * 9);
}
