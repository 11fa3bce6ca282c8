// 1_conv1_bn_relu_pool.cu: the first block, conv1 (one input channel, 28x28) -> BatchNorm2d -> ReLU ->
// maxpool, fused: the fast form of naive/1_normalize.cu, 2_conv2d.cu, 3_batchnorm.cu, 4_relu.cu and 5_maxpool.cu
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
//
// This file holds the three entry points; their pieces are in headers beside it: 1_conv1_common.cuh (the
// geometry, the staging of the images and the patches, which all three share), 1_conv1_forward.cuh (the
// moments' and the forward's) and 1_conv1_backward.cuh (the backward's).
//
// Several models (common.cuh): the grid's z is the model, and each kernel moves its pointers to the model's
// part of every buffer. A model's scratch partials take as many rows as the grid has parts (gridDim.x), so one
// model's scratch size (moment_partial_shape, backward_partial_size) per model holds them. The reductions'
// parts, and the backward's channels per block, are those of a model's own launch (mnist_cuda/ops chooses them
// from one model's batch), so each model's sums are added in the same order, to the same bits.
#include "common.cuh"
#include "tensor_core.cuh"
#include "1_conv1_common.cuh"
#include "1_conv1_forward.cuh"
#include "1_conv1_backward.cuh"

// The batch's image moments, S_t and G_tu in double (see the top of this file). Each block sums its
// part of the batch; the last block merges the parts in order.
// grid (parts, 1, models), CONV1_THREADS threads. Per model (its part of each buffer, the models' one after
// another): x [N,1,28,28], moment_partial [parts, CONV1_MOMENTS], counter: one, moments [CONV1_MOMENTS].
extern "C" __global__ void __launch_bounds__(CONV1_THREADS)
    conv1_image_moments_fast(const unsigned char* x, int N, int imgs_per_block, double* moment_partial,
                             unsigned int* counter, double* moments) {
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ double red[CONV1_THREADS / 32 * CONV1_MOMENTS];
    const int t = threadIdx.x, model = model_index();
    x = model_part(x, (size_t)N * S1 * S1, model);
    moment_partial = model_part(moment_partial, (size_t)gridDim.x * CONV1_MOMENTS, model);
    counter = model_part(counter, 1, model);
    moments = model_part(moments, CONV1_MOMENTS, model);
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    double acc[CONV1_MOMENTS];
#pragma unroll
    for (int k = 0; k < CONV1_MOMENTS; k++) acc[k] = 0.0;
    for_each_image(x, first, last, img, [] {}, [&](int n, const float(&p)[4][4]) { add_window_moments(p, acc); });
    const double sum = block_sums(acc, red);
    if (t < CONV1_MOMENTS) moment_partial[(size_t)blockIdx.x * CONV1_MOMENTS + t] = sum;
    if (!last_block_done(counter, gridDim.x)) return;
    if (t < CONV1_MOMENTS) moments[t] = sum_in_order(moment_partial + t, gridDim.x, CONV1_MOMENTS);
}

// pooled[n,c,ph,pw] = max over the 2x2 window of relu(batchnorm(a)), with the window position.
// In training (train != 0) BatchNorm's statistics come from the batch's image moments (from
// conv1_image_moments_fast): every block computes those of its channels, and the blocks of image 0
// save them (mean, invstd: for the backward) and update the running statistics. In evaluation mean and
// invstd are given (the running statistics', batchnorm_eval_stats) and moments is not read.
// CHANNELS channels per block: more of them spread each block's staging of its image and its setup over
// more work, fewer make more blocks (mnist_cuda/ops/conv1_bn_relu_pool.py chooses).
// The work is (window, group of GROUP_CHANNELS channels) items, dealt to the block's threads in turn
// (pool_item, 1_conv1_forward.cuh).
// The kernel is bound by issuing its own instructions, so it is compiled for four blocks per SM (at most
// 72 registers): with three, its warps leave the schedulers idle more often (docs/performance.md).
// grid (N, ceil(C/CHANNELS), models), CONV1_THREADS threads. Per model: x [N,1,28,28], moments
// [CONV1_MOMENTS], mean and invstd [C], pooled and argmax [N,C,14,14]; its w, gamma and beta param_stride
// floats after the previous model's, its running statistics running_stride. Out, pooled's type: float, or
// bfloat16 (in --precision bf16 conv2's input is stored as bf16, as autocast stores it for the convolution).
template <int CHANNELS, class Out>
__global__ void __launch_bounds__(CONV1_THREADS, 4)
    conv1_bn_relu_pool_fast(const unsigned char* x, const float* w, int train, const double* moments, float eps,
                            float momentum, float* mean, float* invstd, float* running_mean, float* running_var,
                            const float* gamma, const float* beta, int N, int C, Out* pooled, unsigned char* argmax,
                            int param_stride, int running_stride) {
    static_assert(CHANNELS % GROUP_CHANNELS == 0, "whole groups of channels per block");
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CHANNELS][3];
    __shared__ float4 bn[CHANNELS];  // mean, invstd, gamma, beta
    __shared__ double mom[CONV1_MOMENTS];
    forward_model_parts(N, C, param_stride, running_stride, x, w, gamma, beta, moments, mean, invstd, running_mean,
                        running_var, pooled, argmax);
    const int c0 = blockIdx.y * CHANNELS;
    load_channel_weights<CHANNELS>(w, C, c0, ws);
    const auto statistics = [&] {  // while the image is on its way
        channel_batchnorm<CHANNELS>(train, moments, mom, ws, N, C, c0, eps, momentum, mean, invstd, running_mean,
                                    running_var, gamma, beta, bn);
    };
    for_each_staged_image<CONV1_THREADS>(
        x, blockIdx.x, blockIdx.x + 1, img, statistics, [&](int n, const float* image) {
            for (int item = threadIdx.x; item < WINDOWS * (CHANNELS / GROUP_CHANNELS); item += CONV1_THREADS)
                pool_item<CHANNELS, Out>(item, n, image, C, c0, ws, bn, pooled, argmax);
        });
}

// conv1_bn_relu_pool_fast's work with conv1 on the tensor cores (conv1_window_group, 1_conv1_forward.cuh): a warp
// takes groups of MMA_WINDOWS windows in all CONV1_MMA_CHANNELS channels of the block, where a thread of
// conv1_bn_relu_pool_fast takes a window in four. The block's pooled values and positions, one contiguous run of
// each in [N, C, 14, 14], are gathered in shared memory and then written out in whole lines. The outputs differ
// from conv1_bn_relu_pool_fast's only in conv1's rounding (3xTF32, tap 8 last).
// The same grid and arguments as conv1_bn_relu_pool_fast's, a block per image and group of CONV1_MMA_CHANNELS channels,
// CONV1_MMA_THREADS threads.
template <class Out>
__global__ void __launch_bounds__(CONV1_MMA_THREADS, CONV1_MMA_BLOCKS)
    conv1_mma_bn_relu_pool_fast(const unsigned char* x, const float* w, int train, const double* moments, float eps,
                                float momentum, float* mean, float* invstd, float* running_mean, float* running_var,
                                const float* gamma, const float* beta, int N, int C, Out* pooled, unsigned char* argmax,
                                int param_stride, int running_stride) {
    static_assert(CONV1_MMA_THREADS % 32 == 0 && CONV1_MMA_THREADS >= CONV1_MOMENTS, "whole warps; a thread a moment");
    __shared__ __align__(16) float img[2][P1 * P1];
    __shared__ float4 ws[CONV1_MMA_CHANNELS][3];
    __shared__ float4 bn[CONV1_MMA_CHANNELS];  // mean, invstd, gamma, beta
    __shared__ double mom[CONV1_MOMENTS];
    __shared__ __align__(16) Out values[CONV1_MMA_CHANNELS * WINDOWS];
    __shared__ __align__(16) unsigned char positions[CONV1_MMA_CHANNELS * WINDOWS];
    __shared__ bool finite;  // channel_finite for all the block's channels
    forward_model_parts(N, C, param_stride, running_stride, x, w, gamma, beta, moments, mean, invstd, running_mean,
                        running_var, pooled, argmax);
    const int c0 = blockIdx.y * CONV1_MMA_CHANNELS, warp = threadIdx.x / 32, channels = min(CONV1_MMA_CHANNELS, C - c0);
    load_channel_weights<CONV1_MMA_CHANNELS>(w, C, c0, ws);
    const auto setup = [&] {  // while the image is on its way
        channel_batchnorm<CONV1_MMA_CHANNELS>(train, moments, mom, ws, N, C, c0, eps, momentum, mean, invstd,
                                              running_mean, running_var, gamma, beta, bn);
        if (warp == 0) {
            const bool all = __all_sync(0xffffffffu, threadIdx.x >= channels || channel_finite(ws, bn, threadIdx.x));
            if (threadIdx.x == 0) finite = all;
        }
    };
    for_each_staged_image<CONV1_MMA_THREADS>(x, blockIdx.x, blockIdx.x + 1, img, setup, [&](int n, const float* image) {
        Conv1MmaWeights cw;
        conv1_mma_weights(ws, cw);
        for (int group = warp; group < MMA_GROUPS; group += CONV1_MMA_THREADS / 32) {
            const int window0 = group * MMA_WINDOWS;
            float acc[2][4][4];
            conv1_window_group(image, window0, cw, acc);
            if (channels == CONV1_MMA_CHANNELS && finite)
                pool_window_group<true, true>(acc, window0, C, c0, bn, values, positions);
            else if (channels == CONV1_MMA_CHANNELS)
                pool_window_group<true, false>(acc, window0, C, c0, bn, values, positions);
            else
                pool_window_group<false, false>(acc, window0, C, c0, bn, values, positions);
        }
        __syncthreads();
        const size_t first = ((size_t)n * C + c0) * WINDOWS;
        copy_words<CONV1_MMA_THREADS>(values, pooled + first, channels * WINDOWS * (int)sizeof(Out));
        copy_words<CONV1_MMA_THREADS>(positions, argmax + first, channels * WINDOWS);
    });
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
// channel cl in the 14 windows of pooled row `row` (add_row_grads, 1_conv1_backward.cuh, says how their
// shared-memory loads avoid bank conflicts).
// grid (parts, ceil(C/CHANNELS), models), grad_threads<CHANNELS> threads, dynamic shared memory
// CONV1_GRAD_STAGES x grad_stage_bytes<CHANNELS>. Per model: x [N,1,28,28], save_mean and save_invstd [C],
// moments [CONV1_MOMENTS] from conv1_image_moments_fast, d_pooled and argmax [N,C,14,14] (argmax with
// NO_POSITION: conv1_bn_relu_pool_fast), partial [C, parts, CONV1_GRAD_SUMS], counter: one per group; its w,
// gamma and gradients dgamma, dbeta, dw param_stride floats after the previous model's. In, d_pooled's type:
// float, or bfloat16 (in --precision bf16 conv2's input gradient is stored as bf16, as autocast stores it).
template <int CHANNELS, class In>
__global__ void __launch_bounds__(grad_threads<CHANNELS>, grad_blocks_per_sm<CHANNELS>)
    conv1_backward_fast(const unsigned char* x, const float* w, const float* save_mean, const float* save_invstd,
                        const float* gamma, const double* moments, const In* d_pooled, const unsigned char* argmax,
                        int N, int C, int imgs_per_block, float* partial, unsigned int* counter, float* dgamma,
                        float* dbeta, float* dw, int param_stride) {
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
    const int model = model_index();
    x = model_part(x, (size_t)N * S1 * S1, model);
    w = model_part(w, (size_t)param_stride, model);
    gamma = model_part(gamma, (size_t)param_stride, model);
    dgamma = model_part(dgamma, (size_t)param_stride, model);
    dbeta = model_part(dbeta, (size_t)param_stride, model);
    dw = model_part(dw, (size_t)param_stride, model);
    save_mean = model_part(save_mean, C, model);
    save_invstd = model_part(save_invstd, C, model);
    moments = model_part(moments, CONV1_MOMENTS, model);
    d_pooled = model_part(d_pooled, (size_t)N * C * WINDOWS, model);
    argmax = model_part(argmax, (size_t)N * C * WINDOWS, model);
    partial = model_part(partial, (size_t)C * gridDim.x * CONV1_GRAD_SUMS, model);
    counter = model_part(counter, gridDim.y, model);
    const int tid = threadIdx.x, c0 = blockIdx.y * CHANNELS;
    const int row = tid / CHANNELS, cl = tid % CHANNELS;  // this thread's pooled row and channel
    const int channels = min(CHANNELS, C - c0);
    int first, last;
    part_images(blockIdx.x, imgs_per_block, N, &first, &last);
    float acc[CONV1_GRAD_SUMS];  // sum dz, then E_t
#pragma unroll
    for (int i = 0; i < CONV1_GRAD_SUMS; i++) acc[i] = 0.0f;
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
        const In* grads = reinterpret_cast<const In*>(stage) + at0;
        const unsigned char* positions = stage + CHANNELS * WINDOWS * sizeof(float) + at0;
        const float* windows = image + 2 * row * P1;  // the row's first 4x4 patch
        if (cl < channels) add_row_grads(grads, positions, windows, acc);
        // this thread's copies of image n + 1 landed; the loop's barrier shows them to all
        cp_async_wait<CONV1_GRAD_STAGES - 2>();
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
    merge_part_sums<CHANNELS>(moments, partial, c0, channels, mom, total);
    if (tid >= channels) return;
    double wc[TAPS];  // (channel_grads says why it is here)
    channel_grads(c0 + tid, total + tid * CONV1_GRAD_SUMS, mom, N, w, save_mean, save_invstd, gamma, wc, dgamma, dbeta,
                  dw);
}
