// 1_conv1_forward.cuh: the pieces of conv1's forward (conv1_image_moments_fast and conv1_bn_relu_pool_fast,
// fast/1_conv1_bn_relu_pool.cu): a window's share of the batch's image moments, a channel's BatchNorm
// statistics from those moments, and a pooled window's outputs for a group of channels. Together they replace,
// for conv1, naive/2_conv2d.cu's conv2d_forward_naive, naive/3_batchnorm.cu's batchnorm_stats_naive,
// batchnorm_apply_naive and batchnorm_eval_naive, naive/4_relu.cu's relu_forward_naive and naive/5_maxpool.cu's
// maxpool2x2_forward_naive (and normalize_naive by staging: 1_conv1_common.cuh).
#pragma once
#include "1_conv1_common.cuh"

// The window's four outputs' share of every moment, S_a and G_ab (a <= b), added to the thread's double
// sums acc. Each share is summed over the four outputs in float first: that takes a quarter of the
// double-precision additions, and float's rounding on four terms is far below the tests' 1e-5.
__device__ __forceinline__ void add_window_moments(const float (&p)[4][4], double (&acc)[CONV1_MOMENTS]) {
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

// The forward's work is (pooled window, group of GROUP_CHANNELS channels) items, dealt to the block's
// threads in turn: 196 windows alone would leave the seventh warp with 4 threads doing a full warp's
// instructions, while 196 x 8 items are exactly 7 per thread at 32 channels.
#define GROUP_CHANNELS 4

// Item `item` of image n for the block's CHANNELS channels c0..: pooled = maxpool(relu(bn(conv1))) and the
// position, for each channel of the item's group, at its window. The window's 4x4 patch is loaded once for
// the group (8 shared loads for 4 x 36 multiply-adds), and each channel's mean, invstd, gamma and beta (bn)
// as one float4. Out: float, or bfloat16 (conv2's input in --precision bf16: the position is taken from the
// float value, before it is rounded).
template <int CHANNELS, class Out>
__device__ __forceinline__ void pool_item(int item, int n, const float* image, int C, int c0,
                                          const float4 (&ws)[CHANNELS][3], const float4 (&bn)[CHANNELS], Out* pooled,
                                          unsigned char* argmax) {
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
        const float v =
            relu_max4(batchnorm_apply(a[0], s.x, s.y, s.z, s.w), batchnorm_apply(a[1], s.x, s.y, s.z, s.w),
                      batchnorm_apply(a[2], s.x, s.y, s.z, s.w), batchnorm_apply(a[3], s.x, s.y, s.z, s.w), &at);
        store_value(pooled + at0 + k * WINDOWS, v);
        argmax[at0 + k * WINDOWS] = pool_position(v, at);
    }
}
