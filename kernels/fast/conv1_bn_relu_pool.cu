// conv1_bn_relu_pool.cu: the first block, conv1 (one input channel, 28x28) -> BatchNorm2d -> ReLU ->
// maxpool, fused: the fast form of naive/normalize.cu, conv2d.cu, batchnorm.cu, relu.cu and maxpool.cu
// for conv1, forward and backward.
//
// conv1's output a[n,c,h,w] costs 9 multiply-adds from a 3 KB image, yet would be 100 KB per image
// if stored (N*C*784 floats, read and written several times). So it is never stored. The forward
// stages the image in shared memory and recomputes a where it needs it (conv1_window). BatchNorm's
// sums over the batch need no a at all: a = sum_t w[c,t] X_t, where X_t is the zero-padded image
// shifted by tap t, so every sum BatchNorm takes over a is a combination of the batch's image moments
//     S_t = sum X_t,   G_tu = sum X_t X_u     (over the batch's N*28*28 outputs; 9 + 45 numbers),
// the same for all channels: mean_c = w_c.S / count, E[a^2] = w_c' G w_c / count. The moments are
// summed in double: a product of two floats is exact in double, so they are exact up to double's
// rounding, and the cancellation in var = E[a^2] - mean^2 costs nothing. The backward likewise needs
// of each channel only dbeta = sum dz and E_t = sum dz X_t, where dz is nonzero at one position per
// pooled window at most (see conv1_backward_fast).
//
//   conv1_image_moments_fast  the batch's image moments                      (when the batch is loaded)
//   conv1_bn_relu_pool_fast   each channel's mean, invstd from the moments (training), then
//                             pooled = maxpool(relu(bn(a)))                   (forward; eval too)
//   conv1_backward_fast       dgamma, dbeta and dw from the pooled gradient    (backward, one launch)
//
// The moments depend on the images alone, so they are computed as the batch arrives (in the step graph
// on the branch that loads the next batch, beside this step's work), and the forward's statistics cost
// the pool kernel 90 multiply-adds per channel instead of a pass over the batch on the critical path.
//
// Layout: in the forward and the moments a thread works on a pooled window, i.e. the 2x2 outputs under it
// (thread t < 196 owns window t, except that the forward deals (window, 4 channels) items so that every warp
// is full). It copies the 4x4 input patch those four outputs read into registers (eight float2 loads), then
// computes from registers: the forward the four outputs of each of its channels (36 multiply-adds per
// channel for the patch's 8 shared-memory loads, where one output at a time would need 9 loads for 9
// multiply-adds). The backward needs one output per window and channel, the argmax, so it reads that
// output's 3x3 patch from shared memory (conv1_backward_fast).
// The images come as bytes and are normalised as they are staged (normalize_pixel, common.cuh, by a
// table of the 256 values in shared memory).
// The reductions (statistics, backward) give each block a part of the batch (imgs_per_block images),
// sum inside the block in a fixed order, and let the last block (of each channel group) combine the parts.
#include "common.cuh"
#include "tensor_core.cuh"

#define S1 28        // conv1's input and output size
#define P1 (S1 + 2)  // with the zero padding
#define POOLED1 (S1 / 2)
#define WINDOWS (POOLED1 * POOLED1)  // 196 pooled windows per image and channel
#define TAPS 9
// From mnist_cuda/ops/conv1_bn_relu_pool.py (NVRTC -D options): CONV1_THREADS threads per block of the
// forward and the moments, CONV1_MOMENTS image moments (S_t, then G_tu for t <= u, row by row, in double);
// the backward's geometry (for CHANNELS channels per block, its template argument): a thread per channel
// and each of CONV1_GRAD_ROWS pooled rows, CONV1_GRAD_SM_CHANNELS channels over the blocks an SM holds,
// CONV1_GRAD_STAGES images in its ring of CONV1_GRAD_CHANNEL_BYTES per channel and image, and
// CONV1_GRAD_SUMS sums per channel (sum dz, then E_t).
#if !defined(CONV1_THREADS) || !defined(CONV1_MOMENTS) || !defined(CONV1_GRAD_ROWS) ||              \
    !defined(CONV1_GRAD_SM_CHANNELS) || !defined(CONV1_GRAD_STAGES) || !defined(CONV1_GRAD_SUMS) || \
    !defined(CONV1_GRAD_CHANNEL_BYTES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
static_assert(CONV1_MOMENTS == TAPS + TAPS * (TAPS + 1) / 2 && CONV1_GRAD_SUMS == 1 + TAPS, "moment counts");
// CONV1_THREADS: 7 warps; threads 196..223 own no window but join the reductions.

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

// The loop over images [first, last) that every kernel here runs, in blocks of THREADS threads: body(n,
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

// The batch's image moments, S_t and G_tu in double (see the top of this file). Each block sums its
// part of the batch; the last block merges the parts in order.
// grid (parts), CONV1_THREADS threads; moment_partial [parts, CONV1_MOMENTS]; moments [CONV1_MOMENTS]; counter: one.
extern "C" __global__ void __launch_bounds__(CONV1_THREADS)
    conv1_image_moments_fast(const unsigned char* x, int N, int imgs_per_block, double* moment_partial,
                             unsigned int* counter, double* moments) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ double red[CONV1_THREADS / 32 * CONV1_MOMENTS];
    const int t = threadIdx.x;
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    double acc[CONV1_MOMENTS];
#pragma unroll
    for (int k = 0; k < CONV1_MOMENTS; k++) acc[k] = 0.0;
    for_each_image(
        x, first, last, img, [] {},
        [&](int n, const float(&p)[4][4]) {
    // this window's sums over its four outputs in float, added to the double sums (a quarter of the
    // double-precision additions; float's rounding on four terms is far below the tests' 1e-5)
#pragma unroll
            for (int a = 0; a < TAPS; a++) {
#pragma unroll
                for (int b = a - 1; b < TAPS; b++) {  // b = a - 1 stands for S_a
                    float s = 0.0f;
#pragma unroll
                    for (int pos = 0; pos < 4; pos++) {
                        const float xa = p[pos / 2 + a / 3][pos % 2 + a % 3];
                        s = b < a ? s + xa : fmaf(xa, p[pos / 2 + b / 3][pos % 2 + b % 3], s);
                    }
                    acc[b < a ? a : moment_index(a, b)] += s;
                }
            }
        });
    const double sum = block_sums(acc, red);
    if (t < CONV1_MOMENTS) moment_partial[(size_t)blockIdx.x * CONV1_MOMENTS + t] = sum;
    if (!last_block_done(counter, gridDim.x)) return;
    if (t < CONV1_MOMENTS) moments[t] = sum_in_order(moment_partial + t, gridDim.x, CONV1_MOMENTS);
}

// A channel's BatchNorm statistics over the batch's count outputs from its image moments and its
// weights wq (as load_channel_weights stages them): mean = w.S / count, var = w'Gw / count - mean^2, in
// double.
__device__ __forceinline__ void channel_stats(const double* moments, const float4 wq[3], double count, float* mean,
                                              float* var) {
    const double wc[TAPS] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w, wq[2].x};
    double m = 0.0, square = 0.0;
#pragma unroll
    for (int a = 0; a < TAPS; a++) {
        double gw = 0.0;  // (G w)_a
#pragma unroll
        for (int b = 0; b < TAPS; b++) gw += gram(moments, a, b) * wc[b];
        m += wc[a] * moments[a];
        square += wc[a] * gw;
    }
    m /= count;
    *mean = (float)m;
    *var = (float)fmax(square / count - m * m, 0.0);
}

// pooled[n,c,ph,pw] = max over the 2x2 window of relu(batchnorm(a)), with the window position.
// In training (train != 0) BatchNorm's statistics come from the batch's image moments (from
// conv1_image_moments_fast): every block computes those of its channels, and the blocks of image 0
// save them (mean, invstd: for the backward) and update the running statistics. In evaluation mean and
// invstd are given (the running statistics', batchnorm_eval_stats) and moments is not read.
// CHANNELS channels per block: more of them spread each block's staging of its image and its setup over
// more work, fewer make more blocks (mnist_cuda/ops/conv1_bn_relu_pool.py chooses).
// The work is (window, group of GROUP_CHANNELS channels) items, dealt to the block's threads in turn:
// 196 windows alone would leave the seventh warp with 4 threads doing a full warp's instructions, while
// 196 x 8 items are exactly 7 per thread at 32 channels. An item loads its window's 4x4 patch (8 shared
// loads for 4 x 36 multiply-adds) and each channel's mean, invstd, gamma and beta as one float4.
// The kernel is bound by issuing its own instructions, so it is compiled for four blocks per SM (at most
// 72 registers): with three, its warps leave the schedulers idle more often (docs/performance.md).
// grid (N, ceil(C/CHANNELS)), CONV1_THREADS threads.
#define GROUP_CHANNELS 4
template <int CHANNELS>
__global__ void __launch_bounds__(CONV1_THREADS, 4)
    conv1_bn_relu_pool_fast(const unsigned char* x, const float* w, int train, const double* moments, float eps,
                            float momentum, float* mean, float* invstd, float* running_mean, float* running_var,
                            const float* gamma, const float* beta, int N, int C, float* pooled, unsigned char* argmax) {
    static_assert(CHANNELS % GROUP_CHANNELS == 0, "whole groups of channels per block");
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    __shared__ float4 bn[CHANNELS];  // mean, invstd, gamma, beta
    __shared__ double mom[CONV1_MOMENTS];
    const int c0 = blockIdx.y * CHANNELS;
    load_channel_weights<CHANNELS>(w, C, c0, ws);
    const auto statistics = [&] {  // while the image is on its way
        const int cl = threadIdx.x, c = c0 + cl;
        if (train && threadIdx.x < CONV1_MOMENTS) mom[threadIdx.x] = moments[threadIdx.x];
        __syncthreads();  // (every thread calls setup)
        if (cl >= CHANNELS || c >= C) return;
        if (!train) {
            bn[cl] = make_float4(mean[c], invstd[c], gamma[c], beta[c]);
            return;
        }
        const double count = (double)N * S1 * S1;
        float m, var;
        channel_stats(mom, ws[cl], count, &m, &var);
        bn[cl] = make_float4(m, rsqrtf(var + eps), gamma[c], beta[c]);  // invstd as batchnorm_finalize computes it
        if (blockIdx.x == 0)
            batchnorm_finalize(c, m, var, (float)count, eps, momentum, mean, invstd, running_mean, running_var);
    };
    for_each_staged_image<CONV1_THREADS>(
        x, blockIdx.x, blockIdx.x + 1, img, statistics, [&](int n, const float* image) {
            for (int item = threadIdx.x; item < WINDOWS * (CHANNELS / GROUP_CHANNELS); item += CONV1_THREADS) {
                const int t = item % WINDOWS, g0 = item / WINDOWS * GROUP_CHANNELS;
                const int channels = min(GROUP_CHANNELS, C - (c0 + g0));     // (fewer in a last group past C)
                const size_t at0 = ((size_t)n * C + c0 + g0) * WINDOWS + t;  // output of the group's first channel
                float p[4][4];
                load_patch(image, t, p);
#pragma unroll
                for (int k = 0; k < GROUP_CHANNELS; k++) {
                    if (k >= channels) break;
                    float a[4];
                    conv1_window(p, ws[g0 + k], a);
                    const float4 s = bn[g0 + k];
                    int at;
                    const float v = relu_max4(
                        batchnorm_apply(a[0], s.x, s.y, s.z, s.w), batchnorm_apply(a[1], s.x, s.y, s.z, s.w),
                        batchnorm_apply(a[2], s.x, s.y, s.z, s.w), batchnorm_apply(a[3], s.x, s.y, s.z, s.w), &at);
                    pooled[at0 + k * WINDOWS] = v;
                    argmax[at0 + k * WINDOWS] = pool_position(v, at);
                }
            }
        });
}

// The backward's block geometry for CHANNELS channels per block: a thread per pooled row and channel, a
// ring stage of the channels' gradients, then their positions, and as many blocks per SM as make
// CONV1_GRAD_SM_CHANNELS channels (the same threads per SM for every CHANNELS).
static_assert(CONV1_GRAD_ROWS == POOLED1, "a thread per pooled row");
template <int CHANNELS>
constexpr int grad_threads = CONV1_GRAD_ROWS * CHANNELS;
template <int CHANNELS>
constexpr int grad_stage_bytes = CHANNELS * CONV1_GRAD_CHANNEL_BYTES;
template <int CHANNELS>
constexpr int grad_blocks_per_sm = CONV1_GRAD_SM_CHANNELS / CHANNELS;

// The block's part of image n's pooled gradient and argmax into ring stage `stage` by cp.async: channels
// c0 .. c0 + channels - 1 are contiguous in both ([N, C, 14, 14]), so they are copied as two runs of 16-byte
// copies (784 bytes of gradient per channel; the positions, 196 bytes per channel, by 4-byte copies where
// their run is not 16-byte aligned, i.e. where C or `channels` is not a multiple of 4).
template <int CHANNELS>
__device__ __forceinline__ void copy_pooled_grads(const float* d_pooled, const unsigned char* argmax, int n, int C,
                                                  int c0, int channels, unsigned char* stage) {
    constexpr int THREADS = grad_threads<CHANNELS>;
    const size_t first = (size_t)n * C + c0;  // the run's first channel row
    float* grads = reinterpret_cast<float*>(stage);
    const float* from = d_pooled + first * WINDOWS;
    for (int i = threadIdx.x; i < channels * WINDOWS / 4; i += THREADS) cp_async16(grads + 4 * i, from + 4 * i);
    float* positions = reinterpret_cast<float*>(stage + CHANNELS * WINDOWS * sizeof(float));
    const float* bytes = reinterpret_cast<const float*>(argmax + first * WINDOWS);  // 4-byte aligned: 196 = 4 x 49
    if (C % 4 == 0 && channels % 4 == 0) {
        for (int i = threadIdx.x; i < channels * WINDOWS / 16; i += THREADS)
            cp_async16(positions + 4 * i, bytes + 4 * i);
    } else {
        for (int i = threadIdx.x; i < channels * WINDOWS / 4; i += THREADS) cp_async4(positions + i, bytes + i);
    }
}

// conv1's whole backward from the pooled gradient, by the moments (see the top of this file). dz, the
// gradient at BN's output, is nonzero only at each window's argmax, and only where the ReLU passed (the
// forward stores NO_POSITION where it blocked the window, so the pooled values are not read). Each thread
// adds, per channel, dz and dz times the 3x3 input patch there: dbeta = sum dz and E_t = sum dz X_t. Then,
// with a = w.X, xhat = (a - mean) invstd and BN's input gradient da = gamma invstd / count (count dz - dbeta -
// xhat dgamma):
//     dgamma = sum dz xhat = invstd (w.E - mean dbeta)
//     dw_t   = sum da X_t  = gamma invstd / count (count E_t - dbeta S_t - dgamma invstd ((G w)_t - mean S_t))
// computed in double by the last block of each group of CHANNELS channels, after merging the parts.
//
// A block takes CHANNELS channels of a part of the batch, so it stages each image once for all of them (at
// large batches all 32 channels; at smaller ones fewer, so that an SM's blocks overlap their per-image chains:
// mnist_cuda/ops/conv1_bn_relu_pool.py chooses). A channel's sums over a part are taken in the same order
// whatever CHANNELS is. The pooled gradient and positions arrive by cp.async into a ring of CONV1_GRAD_STAGES images
// (one barrier per image, shared with the image's staging): the images ahead are in flight without holding
// registers, and the kernel's bytes need that many in flight to keep memory busy. Thread (row, cl) takes
// channel cl in the 14 windows of pooled row `row`, and reads the 3x3 patch at the argmax from the staged image
// at the position's offset: nine shared-memory loads and no selects. Those addresses depend on each lane's
// argmax, so the lanes of a warp take the same window in different channels (32 channels per block) or one
// column of four pooled rows (8): a tap's loads then fall on at most four cells per window, two rows apart by
// a pitch of 30 (-2 banks), and the windows of four pooled rows 60 floats (-4 banks) apart, so no two
// addresses share a bank.
// grid (parts, ceil(C/CHANNELS)), grad_threads<CHANNELS> threads, dynamic shared memory
// CONV1_GRAD_STAGES x grad_stage_bytes<CHANNELS>; partial [C, parts, CONV1_GRAD_SUMS]; counter: one per group;
// moments from conv1_image_moments_fast; argmax with NO_POSITION (conv1_bn_relu_pool_fast).
static_assert(POOLED1 % 2 == 0, "a row's windows in pairs");
static_assert(CONV1_GRAD_CHANNEL_BYTES == WINDOWS * (sizeof(float) + 1) && CONV1_GRAD_CHANNEL_BYTES % 4 == 0,
              "a channel's gradients and positions in a stage");
static_assert(CONV1_GRAD_STAGES >= 2, "one image ahead at least");
template <int CHANNELS>
__global__ void __launch_bounds__(grad_threads<CHANNELS>, grad_blocks_per_sm<CHANNELS>)
    conv1_backward_fast(const unsigned char* x, const float* w, const float* save_mean, const float* save_invstd,
                        const float* gamma, const double* moments, const float* d_pooled, const unsigned char* argmax,
                        int N, int C, int imgs_per_block, float* partial, unsigned int* counter, float* dgamma,
                        float* dbeta, float* dw) {
    constexpr int THREADS = grad_threads<CHANNELS>, STAGE_BYTES = grad_stage_bytes<CHANNELS>;
    static_assert(CONV1_GRAD_SM_CHANNELS % CHANNELS == 0 && CHANNELS % 4 == 0,
                  "blocks per SM, and 16-byte aligned stages");
    static_assert(THREADS * CONV1_GRAD_SUMS * sizeof(float) <= CONV1_GRAD_STAGES * STAGE_BYTES,
                  "the block's sums fit in the ring");
    static_assert(CHANNELS * CONV1_GRAD_SUMS <= THREADS && CONV1_MOMENTS <= THREADS,
                  "a thread per channel and sum, and per moment");
    extern __shared__ __align__(16) unsigned char ring[];  // CONV1_GRAD_STAGES stages: gradients, then positions
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float total[CHANNELS * CONV1_GRAD_SUMS];
    __shared__ double mom[CONV1_MOMENTS];
    const int tid = threadIdx.x, c0 = blockIdx.y * CHANNELS;
    const int row = tid / CHANNELS, cl = tid % CHANNELS;  // this thread's pooled row and channel
    const int channels = min(CHANNELS, C - c0);
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    float acc[CONV1_GRAD_SUMS];  // sum dz, then E_t
#pragma unroll
    for (int i = 0; i < CONV1_GRAD_SUMS; i++) acc[i] = 0.0f;
    // dz at window position `at` of the window whose 4x4 patch starts at `window`, into the sums. A blocked
    // window (NO_POSITION) adds dz = 0 at position 0, which leaves every sum's bits as they are (the patch's
    // values are finite): no branch, so the windows' loads and products are one straight run of code.
    const auto add = [&](float dz, int at, const float* window) {
        const bool passed = at != NO_POSITION;
        dz = passed ? dz : 0.0f;
        at = passed ? at : 0;
        const float* patch = window + (at / 2) * P1 + at % 2;  // the 3x3 input patch of the argmax
        acc[0] += dz;
#pragma unroll
        for (int tap = 0; tap < TAPS; tap++) acc[1 + tap] = fmaf(dz, patch[(tap / 3) * P1 + tap % 3], acc[1 + tap]);
    };
    const auto copy = [&](int n) {  // image n's gradients, into its stage, as one commit group (empty past last)
        if (n < last)
            copy_pooled_grads<CHANNELS>(d_pooled, argmax, n, C, c0, channels,
                                        ring + (n - first) % CONV1_GRAD_STAGES * STAGE_BYTES);
        cp_async_commit();
    };
    const auto setup = [&] {  // the first images' copies; this thread's of the first image landed
#pragma unroll
        for (int s = 0; s < CONV1_GRAD_STAGES - 1; s++) copy(first + s);
        cp_async_wait<CONV1_GRAD_STAGES - 2>();
    };
    for_each_staged_image<THREADS>(x, first, last, img, setup, [&](int n, const float* image) {
        // the stage of image n - 1, which every thread has finished (the loop's barrier), takes image n + STAGES - 1
        copy(n + CONV1_GRAD_STAGES - 1);
        const unsigned char* stage = ring + (n - first) % CONV1_GRAD_STAGES * STAGE_BYTES;
        const int at0 = cl * WINDOWS + row * POOLED1;  // the row's first window in the channel's gradients
        const float* grads = reinterpret_cast<const float*>(stage) + at0;
        const unsigned char* positions = stage + CHANNELS * WINDOWS * sizeof(float) + at0;
        const float* windows = image + 2 * row * P1;  // the row's first 4x4 patch
        if (cl < channels) {
#pragma unroll
            for (int k = 0; k < POOLED1; k += 2) {  // two windows per load (at0 and k are even)
                const float2 dz = *reinterpret_cast<const float2*>(grads + k);
                const uchar2 at = *reinterpret_cast<const uchar2*>(positions + k);
                add(dz.x, at.x, windows + 2 * k);
                add(dz.y, at.y, windows + 2 * k + 2);
            }
        }
        cp_async_wait<CONV1_GRAD_STAGES -
                      2>();  // this thread's copies of image n + 1 landed; the loop's barrier shows them to all
    });
    // the block's sums: each thread's into the ring (its copies are done: the last groups are empty), then
    // per channel and sum over the rows in order
    cp_async_wait<0>();
    float* red = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int i = 0; i < CONV1_GRAD_SUMS; i++) red[tid * CONV1_GRAD_SUMS + i] = acc[i];
    __syncthreads();
    // this thread's channel and sum
    const int sum_channel = tid / CONV1_GRAD_SUMS, k = tid % CONV1_GRAD_SUMS, c = c0 + sum_channel;
    if (tid < CHANNELS * CONV1_GRAD_SUMS && sum_channel < channels) {
        const float* from = red + sum_channel * CONV1_GRAD_SUMS + k;
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < CONV1_GRAD_ROWS; r++) sum += from[r * CHANNELS * CONV1_GRAD_SUMS];
        partial[((size_t)c * gridDim.x + blockIdx.x) * CONV1_GRAD_SUMS + k] = sum;
    }
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    if (tid < CONV1_MOMENTS) mom[tid] = moments[tid];
    if (tid < CHANNELS * CONV1_GRAD_SUMS && sum_channel < channels)
        total[tid] = sum_in_order(partial + (size_t)c * gridDim.x * CONV1_GRAD_SUMS + k, gridDim.x, CONV1_GRAD_SUMS);
    __syncthreads();
    if (tid >= channels) return;
    const int ch = c0 + tid;
    const float* sums = total + tid * CONV1_GRAD_SUMS;  // sum dz, E_0 .. E_8
    const double count = (double)N * S1 * S1, mean = save_mean[ch], invstd = save_invstd[ch], db = sums[0];
    double wc[TAPS], wE = 0.0;
#pragma unroll
    for (int a = 0; a < TAPS; a++) {
        wc[a] = w[ch * TAPS + a];
        wE += wc[a] * sums[1 + a];
    }
    const double dg = invstd * (wE - mean * db), kk = gamma[ch] * invstd / count;
#pragma unroll
    for (int a = 0; a < TAPS; a++) {
        double gw = 0.0;  // (G w)_a
#pragma unroll
        for (int b = 0; b < TAPS; b++) gw += gram(mom, a, b) * wc[b];
        dw[ch * TAPS + a] = (float)(kk * (count * sums[1 + a] - db * mom[a] - dg * invstd * (gw - mean * mom[a])));
    }
    dgamma[ch] = (float)dg;
    dbeta[ch] = (float)db;
}
