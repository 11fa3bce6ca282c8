// 1_conv1_backward.cuh: the pieces of conv1's backward (conv1_backward_fast, fast/1_conv1_bn_relu_pool.cu): its
// block geometry, the ring of pooled gradients and positions that cp.async fills, the sums a thread adds at
// its windows' argmax, their reduction over the block and the batch, and a channel's weight and BatchNorm
// gradients from its sums and the image moments. Together they replace, for conv1, naive/5_maxpool.cu's
// maxpool2x2_backward_naive, naive/4_relu.cu's relu_backward_naive, naive/3_batchnorm.cu's
// batchnorm_backward_naive and naive/2_conv2d.cu's conv2d_backward_weight_naive (conv1 needs no input gradient).
#pragma once
#include "1_conv1_common.cuh"
#include "tensor_core.cuh"

// From mnist_cuda/ops/conv1_bn_relu_pool.py (NVRTC -D options), the backward's geometry for CHANNELS channels
// per block (its template argument): a thread per channel and each of CONV1_GRAD_ROWS pooled rows,
// CONV1_GRAD_SM_CHANNELS channels over the blocks an SM holds, CONV1_GRAD_STAGES images in its ring of
// CONV1_GRAD_CHANNEL_BYTES per channel and image, and CONV1_GRAD_SUMS sums per channel (sum dz, then E_t).
#if !defined(CONV1_GRAD_ROWS) || !defined(CONV1_GRAD_SM_CHANNELS) || !defined(CONV1_GRAD_STAGES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#if !defined(CONV1_GRAD_SUMS) || !defined(CONV1_GRAD_CHANNEL_BYTES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
static_assert(CONV1_GRAD_SUMS == 1 + TAPS, "the backward's sums: sum dz, then E_t");
static_assert(POOLED1 % 2 == 0, "a row's windows in pairs");
static_assert(CONV1_GRAD_CHANNEL_BYTES == WINDOWS * (sizeof(float) + 1) && CONV1_GRAD_CHANNEL_BYTES % 4 == 0,
              "a channel's gradients and positions in a stage");
static_assert(CONV1_GRAD_STAGES >= 2, "one image ahead at least");

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
// copies (784 bytes of gradient per channel, 392 as bf16; the positions, 196 bytes per channel). A run that does
// not start 16-byte aligned goes by 4-byte copies: the positions' where C or `channels` is not a multiple of 4,
// bf16 gradients' where either is odd. The stage keeps a float's room per gradient in either type.
template <int CHANNELS, class In>
__device__ __forceinline__ void copy_pooled_grads(const In* d_pooled, const unsigned char* argmax, int n, int C, int c0,
                                                  int channels, unsigned char* stage) {
    constexpr int THREADS = grad_threads<CHANNELS>, PER_WORD = 4 / sizeof(In);
    const size_t first = (size_t)n * C + c0;  // the run's first channel row
    float* grads = reinterpret_cast<float*>(stage);
    const float* from = reinterpret_cast<const float*>(d_pooled + first * WINDOWS);  // 4-byte aligned: 196 = 4 x 49
    const int words = channels * WINDOWS / PER_WORD;
    if (PER_WORD == 1 || (C % 2 == 0 && channels % 2 == 0)) {
        for (int i = threadIdx.x; i < words / 4; i += THREADS) cp_async16(grads + 4 * i, from + 4 * i);
    } else {
        for (int i = threadIdx.x; i < words; i += THREADS) cp_async4(grads + i, from + i);
    }
    float* positions = reinterpret_cast<float*>(stage + CHANNELS * WINDOWS * sizeof(float));
    const float* bytes = reinterpret_cast<const float*>(argmax + first * WINDOWS);  // 4-byte aligned: 196 = 4 x 49
    if (C % 4 == 0 && channels % 4 == 0) {
        for (int i = threadIdx.x; i < channels * WINDOWS / 16; i += THREADS)
            cp_async16(positions + 4 * i, bytes + 4 * i);
    } else {
        for (int i = threadIdx.x; i < channels * WINDOWS / 4; i += THREADS) cp_async4(positions + i, bytes + i);
    }
}

// dz at window position `at` of the window whose 4x4 patch starts at `window`, into the thread's sums acc
// (sum dz, then E_t). A blocked window (NO_POSITION) adds dz = 0 at position 0, which leaves every sum's bits
// as they are (the patch's values are finite): no branch, so the windows' loads and products are one straight
// run of code.
__device__ __forceinline__ void add_window_grad(float dz, int at, const float* window, float (&acc)[CONV1_GRAD_SUMS]) {
    const bool passed = at != NO_POSITION;
    dz = passed ? dz : 0.0f;
    at = passed ? at : 0;
    const float* patch = window + (at / 2) * P1 + at % 2;  // the 3x3 input patch of the argmax
    acc[0] += dz;
#pragma unroll
    for (int tap = 0; tap < TAPS; tap++) acc[1 + tap] = fmaf(dz, patch[(tap / 3) * P1 + tap % 3], acc[1 + tap]);
}

// Thread (row, cl)'s windows of a staged image into its sums: the 14 windows of its pooled row in its channel,
// their dz and positions from the ring stage at grads and positions, the 4x4 patches from windows on, and the
// 3x3 patch at each argmax read at the position's offset (nine shared-memory loads and no selects). Those
// addresses depend on each lane's argmax, so the lanes of a warp take the same window in different channels
// (32 channels per block) or one column of four pooled rows (8): a tap's loads then fall on at most four
// cells per window, two rows apart by a pitch of 30 (-2 banks), and the windows of four pooled rows 60 floats
// (-4 banks) apart, so no two addresses share a bank.
template <class In>
__device__ __forceinline__ void add_row_grads(const In* grads, const unsigned char* positions, const float* windows,
                                              float (&acc)[CONV1_GRAD_SUMS]) {
#pragma unroll
    for (int k = 0; k < POOLED1; k += 2) {  // two windows per load (the row's first window and k are even)
        const float2 dz = load_pair(grads + k);
        const uchar2 at = *reinterpret_cast<const uchar2*>(positions + k);
        add_window_grad(dz.x, at.x, windows + 2 * k, acc);
        add_window_grad(dz.y, at.y, windows + 2 * k + 2, acc);
    }
}

// In the group's last block: the moments into mom, and each of the group's sums over the parts in order into
// total [CHANNELS, CONV1_GRAD_SUMS], by the thread that summed it over its block; the block then sees both.
template <int CHANNELS>
__device__ __forceinline__ void merge_part_sums(const double* moments, const float* partial, int c0, int channels,
                                                double* mom, float* total) {
    const int tid = threadIdx.x;
    const int sum_channel = tid / CONV1_GRAD_SUMS, k = tid % CONV1_GRAD_SUMS, c = c0 + sum_channel;
    if (tid < CONV1_MOMENTS) mom[tid] = moments[tid];
    if (tid < CHANNELS * CONV1_GRAD_SUMS && sum_channel < channels)
        total[tid] = sum_in_order(partial + (size_t)c * gridDim.x * CONV1_GRAD_SUMS + k, gridDim.x, CONV1_GRAD_SUMS);
    __syncthreads();
}

// Channel ch's gradients from its sums over the batch (sum dz, E_0 .. E_8) and the image moments mom, in
// double (conv1_backward_fast's comment derives them):
//     dgamma = invstd (w.E - mean dbeta),  dbeta = sum dz,
//     dw_t   = gamma invstd / count (count E_t - dbeta S_t - dgamma invstd ((G w)_t - mean S_t))
// wc receives the channel's weights in double. It is the kernel's array, not one of this function's own:
// the compiler places an inlined function's arrays ahead of the kernel's locals, and that renumbers the
// registers of the whole kernel.
__device__ __forceinline__ void channel_grads(int ch, const float* sums, const double* mom, int N, const float* w,
                                              const float* save_mean, const float* save_invstd, const float* gamma,
                                              double (&wc)[TAPS], float* dgamma, float* dbeta, float* dw) {
    const double count = (double)N * S1 * S1, mean = save_mean[ch], invstd = save_invstd[ch], db = sums[0];
    double wE = 0.0;
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
