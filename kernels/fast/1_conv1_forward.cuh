// 1_conv1_forward.cuh: the pieces of conv1's forward (conv1_image_moments_fast and conv1_bn_relu_pool_fast,
// fast/1_conv1_bn_relu_pool.cu): a window's share of the batch's image moments, a channel's BatchNorm
// statistics from those moments, and a pooled window's outputs for a group of channels. Together they replace,
// for conv1, naive/2_conv2d.cu's conv2d_forward_naive, naive/3_batchnorm.cu's batchnorm_stats_naive,
// batchnorm_apply_naive and batchnorm_eval_naive, naive/4_relu.cu's relu_forward_naive and naive/5_maxpool.cu's
// maxpool2x2_forward_naive (and normalize_naive by staging: 1_conv1_common.cuh).
#pragma once
#include "1_conv1_common.cuh"
#include "tensor_core.cuh"

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

// The forward's pointers moved to its model's part of every buffer (model_index, common.cuh): per model x
// [N,1,28,28], moments, mean and invstd [C], pooled and argmax [N,C,14,14]; w, gamma and beta param_stride floats
// after the previous model's, the running statistics running_stride.
template <class Out>
__device__ __forceinline__ void forward_model_parts(int N, int C, int param_stride, int running_stride,
                                                    const unsigned char*& x, const float*& w, const float*& gamma,
                                                    const float*& beta, const double*& moments, float*& mean,
                                                    float*& invstd, float*& running_mean, float*& running_var,
                                                    Out*& pooled, unsigned char*& argmax) {
    const int model = model_index();
    x = model_part(x, (size_t)N * S1 * S1, model);
    w = model_part(w, (size_t)param_stride, model);
    gamma = model_part(gamma, (size_t)param_stride, model);
    beta = model_part(beta, (size_t)param_stride, model);
    moments = model_part(moments, CONV1_MOMENTS, model);
    mean = model_part(mean, C, model);
    invstd = model_part(invstd, C, model);
    running_mean = model_part(running_mean, (size_t)running_stride, model);
    running_var = model_part(running_var, (size_t)running_stride, model);
    pooled = model_part(pooled, (size_t)N * C * WINDOWS, model);
    argmax = model_part(argmax, (size_t)N * C * WINDOWS, model);
}

// The block's CHANNELS channels c0.. BatchNorm parameters into bn (mean, invstd, gamma, beta): in training
// (train != 0) from the image moments, staged in mom, and the weights ws (load_channel_weights); the blocks of
// image 0 save the statistics and update the running ones. In evaluation mean and invstd are given (the running
// statistics', batchnorm_eval_stats). Every thread of the block calls it (it holds a barrier).
template <int CHANNELS>
__device__ __forceinline__ void channel_batchnorm(int train, const double* moments, double* mom,
                                                  const float4 (&ws)[CHANNELS][3], int N, int C, int c0, float eps,
                                                  float momentum, float* mean, float* invstd, float* running_mean,
                                                  float* running_var, const float* gamma, const float* beta,
                                                  float4 (&bn)[CHANNELS]) {
    const int cl = threadIdx.x, c = c0 + cl;
    if (train && threadIdx.x < CONV1_MOMENTS) mom[threadIdx.x] = moments[threadIdx.x];
    __syncthreads();
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

// ---- conv1 on the tensor cores (conv1_mma_bn_relu_pool_fast) ------------------------------------------------------
// conv1 as a product: A = the image's 3x3 patches, a row per output position and a column per tap; B = the
// weights, a row per tap and a column per channel. A warp takes a group of MMA_WINDOWS pooled windows and all
// CONV1_MMA_CHANNELS channels: two m16 tiles, the windows' top rows of outputs, then their bottom rows, each tile's row
// g the left output of window g and row g + 8 its right one. mma.sync's C fragment then gives lane (g, t) the whole
// window g in channels 2t and 2t + 1 of each n8 tile, so it pools in registers. Taps 0..7 are one k8 step in
// 3xTF32 (float32's accuracy, as the CUDA cores' conv1_window: the weights split once per block, the patch values
// as they are loaded); tap 8 is one float32 multiply-add per output, which costs fewer instructions than a second
// k8 step of seven zero taps.
#define MMA_WINDOWS 8
#define MMA_GROUPS CEIL_DIV(WINDOWS, MMA_WINDOWS)  // 25 groups per image, the last half empty
// From mnist_cuda/ops/conv1_bn_relu_pool.py (NVRTC -D options): CONV1_MMA_CHANNELS channels per block (four n8
// tiles: the network's 32), CONV1_MMA_THREADS threads and CONV1_MMA_BLOCKS blocks per SM (its launch bounds).
#if !defined(CONV1_MMA_CHANNELS) || !defined(CONV1_MMA_THREADS) || !defined(CONV1_MMA_BLOCKS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
static_assert(CONV1_MMA_CHANNELS == 32, "four n8 tiles per warp");

// This lane's part of the block's weights: the B fragments of taps 0..7 for the four n8 tiles (b[r] = B(t + 4r, g)
// = w[8j + g, t + 4r]), split for 3xTF32, and tap 8's weight of the lane's accumulator channels 8j + 2t + h.
struct Conv1MmaWeights {
    unsigned big[4][2], small[4][2];
    float tap8[4][2];
};

__device__ __forceinline__ void conv1_mma_weights(const float4 (&ws)[CONV1_MMA_CHANNELS][3], Conv1MmaWeights& cw) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float* column = reinterpret_cast<const float*>(ws[8 * j + g]);
#pragma unroll
        for (int r = 0; r < 2; r++) split_tf32(column[t + 4 * r], &cw.big[j][r], &cw.small[j][r]);
#pragma unroll
        for (int h = 0; h < 2; h++) cw.tap8[j][h] = reinterpret_cast<const float*>(ws[8 * j + 2 * t + h])[8];
    }
}

// conv1's outputs of this lane's window (window0 + g; a window past the image reads the last one's patch) into
// acc[dy][j]: row dy of the window (0 top, 1 bottom), n8 tile j, as mma.sync's C fragment: acc[dy][j][2s + h] is
// the output at column s of the window's row in channel 8j + 2t + h.
__device__ __forceinline__ void conv1_window_group(const float* image, int window0, const Conv1MmaWeights& cw,
                                                   float (&acc)[2][4][4]) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int window = min(window0 + g, WINDOWS - 1);
    const float* patch = image + 2 * (window / POOLED1) * P1 + 2 * (window % POOLED1);   // the window's 4x4 patch
    const int tap_lo = (t / 3) * P1 + t % 3, tap_hi = ((t + 4) / 3) * P1 + (t + 4) % 3;  // taps t and t + 4
#pragma unroll
    for (int dy = 0; dy < 2; dy++) {
        const float* row = patch + dy * P1;
        // a[r] = A(g + 8 (r % 2), t + 4 (r / 2)): the left output (row g) or the right one (g + 8) at tap t or t + 4
        const float a[4] = {row[tap_lo], row[tap_lo + 1], row[tap_hi], row[tap_hi + 1]};
        unsigned big[4], small[4];
#pragma unroll
        for (int r = 0; r < 4; r++) split_tf32(a[r], &big[r], &small[r]);
        const float tap8[2] = {row[2 * P1 + 2], row[2 * P1 + 3]};  // tap 8 of the left and the right output
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int r = 0; r < 4; r++) acc[dy][j][r] = 0.0f;
            mma_3xtf32(acc[dy][j], big, small, cw.big[j], cw.small[j]);
#pragma unroll
            for (int r = 0; r < 4; r++) acc[dy][j][r] = fmaf(tap8[r / 2], cw.tap8[j][r % 2], acc[dy][j][r]);
        }
    }
}

// Whether no BatchNorm output of channel cl (of the block's CHANNELS) can be NaN or overflow, whatever the image:
// its weights and BatchNorm parameters finite, and |bn(a)| <= FLT_MAX / 8 for every |a| <= sum |w| max|pixel|
// (NaN and infinity fail the comparison). Then pooling needs no NaN test (relu_max4_finite).
template <int CHANNELS>
__device__ __forceinline__ bool channel_finite(const float4 (&ws)[CHANNELS][3], const float4 (&bn)[CHANNELS], int cl) {
    const float* wc = reinterpret_cast<const float*>(ws[cl]);
    double a = 0.0;
    for (int tap = 0; tap < TAPS; tap++) a += fabs((double)wc[tap]);
    a *= fmax(fabs((double)normalize_pixel(0)), fabs((double)normalize_pixel(255)));
    const float4 s = bn[cl];
    const double z = (a + fabs((double)s.x)) * fabs((double)s.y) * fabs((double)s.z) + fabs((double)s.w);
    return z <= 3.4028234663852886e38 / 8.0;  // FLT_MAX / 8
}

// pooled = maxpool(relu(bn(conv1))) and the position, from acc (conv1_window_group), for this lane's window in its
// channels 8j + 2t + h of the block's, into the block's image of them: values[channel][window], positions likewise
// (pool_item's bn). FULL: all CONV1_MMA_CHANNELS channels below C, else those past C are skipped. FINITE:
// channel_finite holds for the block, so the values are pooled without a NaN test (the same bits as relu_max4's).
template <bool FULL, bool FINITE, class Out>
__device__ __forceinline__ void pool_window_group(const float (&acc)[2][4][4], int window0, int C, int c0,
                                                  const float4 (&bn)[CONV1_MMA_CHANNELS], Out* values,
                                                  unsigned char* positions) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4, window = window0 + g;
    if (window >= WINDOWS) return;
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int cl = 8 * j + 2 * t + h;
            if (!FULL && c0 + cl >= C) continue;
            const float4 s = bn[cl];
            const auto z = [&](float a) { return batchnorm_apply(a, s.x, s.y, s.z, s.w); };
            const float tl = z(acc[0][j][h]), tr = z(acc[0][j][2 + h]), bl = z(acc[1][j][h]), br = z(acc[1][j][2 + h]);
            int at;
            const float v = FINITE ? relu_max4_finite(tl, tr, bl, br, &at) : relu_max4(tl, tr, bl, br, &at);
            store_value(values + cl * WINDOWS + window, v);
            positions[cl * WINDOWS + window] = pool_position(v, at);
        }
    }
}

// The block's image of `count` bytes at from (4-byte aligned) to `to` (likewise), a 4-byte word per thread per
// step: each warp's stores are 128 contiguous bytes, where pool_window_group's lanes each write 8 windows of
// four channels apart.
template <int THREADS>
__device__ __forceinline__ void copy_words(const void* from, void* to, int count) {
    const unsigned* f = static_cast<const unsigned*>(from);
    unsigned* d = static_cast<unsigned*>(to);
    for (int i = threadIdx.x; i < count / 4; i += THREADS) d[i] = f[i];
}
