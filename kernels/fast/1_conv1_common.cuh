// 1_conv1_common.cuh: what conv1's three kernels (fast/1_conv1_bn_relu_pool.cu) share: conv1's geometry and
// compile-time constants, the loop that stages each image of the batch in shared memory (normalised from
// its bytes as it lands: naive/1_normalize.cu's normalize_naive, done on the way), the 4x4 input patch under
// a pooled window, conv1's four outputs under it (naive/2_conv2d.cu's conv2d_forward_naive for conv1, one
// window at a time), the block's sums in a fixed order and where each image moment is kept. The forward's
// own pieces are in 1_conv1_forward.cuh, the backward's in 1_conv1_backward.cuh.
#pragma once
#include "common.cuh"

#define S1 28        // conv1's input and output size
#define P1 (S1 + 2)  // with the zero padding
#define POOLED1 (S1 / 2)
#define WINDOWS (POOLED1 * POOLED1)  // 196 pooled windows per image and channel
#define TAPS 9
// From mnist_cuda/ops/conv1_bn_relu_pool.py (NVRTC -D options): CONV1_THREADS threads per block of the
// forward and the moments, 7 warps (thread t < 196 owns pooled window t; threads 196..223 own none but join
// the reductions), and CONV1_MOMENTS image moments (S_t, then G_tu for t <= u, row by row, in double). The
// backward's constants are 1_conv1_backward.cuh's.
#if !defined(CONV1_THREADS) || !defined(CONV1_MOMENTS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
static_assert(CONV1_MOMENTS == TAPS + TAPS * (TAPS + 1) / 2, "the image moments: S_t, then G_tu for t <= u");

// Element i of the zero-padded P1 x P1 image: inside the 28x28 image (then *pixel is its index there)
// or in the padding.
__device__ __forceinline__ bool padded_pixel(int i, int* pixel) {
    const int row = i / P1 - 1, col = i % P1 - 1;
    *pixel = row * S1 + col;
    return i < P1 * P1 && row >= 0 && row < S1 && col >= 0 && col < S1;
}

// This thread's pixels of image n of x [N,1,28,28] (bytes) into registers, for blocks of THREADS threads
// (the loads are issued here; only a use of v waits for them).
template <int THREADS>
constexpr int image_regs = CEIL_DIV(P1 * P1, THREADS);
template <int THREADS>
__device__ __forceinline__ void fetch_padded_image(const unsigned char* x, int n,
                                                   unsigned char (&v)[image_regs<THREADS>]) {
#pragma unroll
    for (int r = 0; r < image_regs<THREADS>; r++) {
        int pixel;
        v[r] = padded_pixel(threadIdx.x + r * THREADS, &pixel) ? x[n * S1 * S1 + pixel] : 0;
    }
}

// ... then normalised (pixel_value[byte]) into the block's shared copy, zero-padded to P1 x P1 (the
// padding pads the normalised image, so it stays 0).
template <int THREADS>
__device__ __forceinline__ void store_padded_image(const unsigned char (&v)[image_regs<THREADS>],
                                                   const float* pixel_value, float* img) {
#pragma unroll
    for (int r = 0; r < image_regs<THREADS>; r++) {
        const int i = threadIdx.x + r * THREADS;
        int pixel;
        if (i < P1 * P1) img[i] = padded_pixel(i, &pixel) ? pixel_value[v[r]] : 0.0f;
    }
}

// Stage the block's CHANNELS channel weights c0.., 12 floats per channel (9 used) so that a channel's
// weights are three float4 loads (broadcast: every thread reads the same address).
template <int CHANNELS>
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

// The loop over images [first, last) that every conv1 kernel runs, in blocks of THREADS threads: body(n,
// image) is called by every thread with the staged, zero-padded image n. The images pass through two
// shared-memory buffers: while the block computes image n from one, image n+1 is on its way from global
// memory into registers, and goes to the other buffer afterwards. One barrier per image, and the loads of
// the next image overlap the work on this one. setup() runs once while the first image is on its way;
// what it writes to shared memory is visible to body (two barriers follow it).
template <int THREADS, class Setup, class Body>
__device__ __forceinline__ void for_each_staged_image(const unsigned char* x, int first, int last,
                                                      float img[2][P1 * P1], Setup setup, Body body) {
    // normalize_pixel of every byte value, once per block (its two divisions per pixel, in every
    // kernel and channel group, cost more than the table: docs/performance.md)
    __shared__ float pixel_value[256];
    unsigned char next[image_regs<THREADS>];
    fetch_padded_image<THREADS>(x, first, next);
    setup();
    for (int v = threadIdx.x; v < 256; v += blockDim.x) pixel_value[v] = normalize_pixel((unsigned char)v);
    __syncthreads();
    store_padded_image<THREADS>(next, pixel_value, img[0]);
    __syncthreads();
    for (int n = first; n < last; n++) {
        if (n + 1 < last) fetch_padded_image<THREADS>(x, n + 1, next);
        body(n, static_cast<const float*>(img[(n - first) % 2]));
        if (n + 1 < last) store_padded_image<THREADS>(next, pixel_value, img[(n + 1 - first) % 2]);
        __syncthreads();
    }
}

// The same loop where thread t < WINDOWS owns pooled window t: body(n, p) gets its 4x4 patch p of image n.
template <class Setup, class Body>
__device__ __forceinline__ void for_each_image(const unsigned char* x, int first, int last, float img[2][P1 * P1],
                                               Setup setup, Body body) {
    for_each_staged_image<CONV1_THREADS>(x, first, last, img, setup, [&](int n, const float* image) {
        if (threadIdx.x < WINDOWS) {
            float p[4][4];
            load_patch(image, threadIdx.x, p);
            body(n, p);
        }
    });
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

// The images of block part b: [first, last).
__device__ __forceinline__ void part_images(int b, int imgs_per_block, int N, int* first, int* last) {
    *first = b * imgs_per_block;
    *last = min(N, *first + imgs_per_block);
}

// Each of the K values v[k] summed over the block in a fixed order (warp butterflies, then the warps
// in order); thread k < K returns total k, the others 0. red: K * (blockDim.x / 32) values.
template <class T, int K>
__device__ __forceinline__ T block_sums(const T (&v)[K], T* red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const T s = warp_sum(v[k]);
        if (lane == 0) red[warp * K + k] = s;
    }
    __syncthreads();
    T total = 0;
    if (threadIdx.x < K)
        for (int w = 0; w < warps; w++) total += red[w * K + threadIdx.x];
    return total;
}

// Where G_tu (t <= u) is among the moments.
__device__ __forceinline__ int moment_index(int t, int u) { return TAPS + TAPS * t - t * (t - 1) / 2 + (u - t); }

// G_tu for any t, u (G is symmetric).
__device__ __forceinline__ double gram(const double* moments, int t, int u) {
    return moments[t <= u ? moment_index(t, u) : moment_index(u, t)];
}
