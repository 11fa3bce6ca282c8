// 2_conv2_implicit_gemm.cu: conv2 (3x3, stride 1, zero padding 1, no bias, 14x14 images) as matrix products
// on the tensor cores: the fast form of naive/2_conv2d.cu for conv2. The spatial size is a compile-time
// constant, so the index arithmetic is multiplies and shifts, not divisions.
//
// This file holds the entry points; the headers beside it hold the work:
//   2_conv2_tile_forms.cuh     how the forward and the input gradient lay out their products: the launch
//                              geometry, the forms of operand A (TileForm), the products of a k-step
//   2_conv2_stage_weights.cuh  conv2_stage_weights_fast's work: the weights as those products read them
//   2_conv2_image_tile.cuh     conv3x3_image_tile, the forward and the input gradient (conv2_forward_fast,
//                              conv2_backward_input_fast and their 3xTF32 forms): conv2d_forward_naive and
//                              conv2d_backward_input_naive; conv3x3_image_tiles_persistent, the forward's
//                              persistent form for large batches (conv2_forward_persistent_fast)
//   2_conv2_warpgroup_pair.cuh conv3x3_image_tiles_warpgroup_pair, the 3xTF32 forward for large batches: a block
//                              per SM of two warpgroups with the weights resident (conv2_forward_warpgroup_pair_fast)
//   2_conv2_warp_specialized.cuh conv3x3_image_tiles_warp_specialized, the pair with producer warpgroups staging its
//                              chunks (conv2_forward_warp_specialized_fast)
//   2_conv2_weight_grad.cuh    conv3x3_weight_grad_rows, the weight gradient in split parts
//                              (conv2_backward_weight_fast): conv2d_backward_weight_naive; to_weight_grad_layout,
//                              x and dy as its staging reads them best (conv2_weight_grad_layout_fast)
#include "common.cuh"
#include "tensor_core.cuh"
#include "2_conv2_tile_forms.cuh"
#include "2_conv2_stage_weights.cuh"
#include "2_conv2_image_tile.cuh"
#include "2_conv2_warpgroup_pair.cuh"
#include "2_conv2_warp_specialized.cuh"
#include "2_conv2_weight_grad.cuh"

// Entry points: the precision (tensor_core.cuh) is a template parameter. Precision::Fp32 keeps float32's
// accuracy with the three products of 3xTF32; Precision::Tf32 rounds both operands to the nearest TF32 and
// multiplies once, as cuDNN's TF32 convolutions do: about 3e-4 relative error instead of 1e-6. The image
// tiles' A then holds a row per output channel (TileForm::OnePart): a third of the forward's tensor work,
// and for the input gradient half the blocks and half its tensor work; the weight gradient does a third of
// its tensor work. Precision::Bf16 rounds both operands to bf16 (about 3e-3 relative error) and multiplies
// once, 16 k per instruction: the TF32 form's layouts with 8 values in each 16 bytes, so a chunk is 16
// channels and a weight-gradient item 8 images, and each product needs half the instructions of plain TF32.
// In Bf16, conv2's input x, its output y and both gradients, dy and dx, are stored as bf16 too (conv2_stored,
// 2_conv2_tile_forms.cuh), as torch.autocast stores them.

// grid (ceil(one model's quads / block), 1, models): model m's w at +m * param_stride, its staged weights at
// +m * (one model's quads of each product)
template <Precision P>
__global__ void conv2_stage_weights_fast(const float* w, int C, int K, float4* forward_quads, float4* input_grad_quads,
                                         int forward_stacked, int input_grad_paired, int param_stride) {
    stage_weights<P>(w, C, K, forward_quads, input_grad_quads, forward_stacked, input_grad_paired, param_stride);
}

// Image-tile blocks per SM the kernels are compiled for: four (at most 128 registers), but three for the
// paired form, whose second set of 56 accumulators needs more than 128 (at most 168).
template <TileForm F>
constexpr int image_tile_blocks_per_sm = F == TileForm::Paired ? 3 : 4;

// grid (models * N, ceil(K / tile channels), CONV2_SIZE / CONV_ROWS), CONV_THREADS threads, dynamic shared memory;
// N and images_per_model: one model's batch; x, y: the models' batches one after another, [models][N][..];
// forward_quads: the models' staged weights, [models][one model's quads]; x and y in conv2_stored<P> (bf16 in Bf16)
template <Precision P>
__global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<tile_form<P, false>>)
    conv2_forward_fast(const conv2_stored<P>* x, const float4* forward_quads, conv2_stored<P>* y, int N, int C, int K,
                       int images_per_model) {
    conv3x3_image_tile<P, tile_form<P, false>>(x, forward_quads, y, C, K, images_per_model);
}

// The 3xTF32 forward with its output's moments, for BN2's statistics from a block per tile (one model): y as
// conv2_forward_fast<Precision::Fp32> writes it, and each block's (mean, M2) of its tile's channels in moment_parts
// [K, N * CONV2_SIZE / CONV_ROWS, 2] (batchnorm_stats_from_tiles_fast, fast/3_bn_relu_pool.cu, merges them): no pass
// of its own over y. Grid (N, ceil(K / tile channels), CONV2_SIZE / CONV_ROWS), as the forward.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<TileForm::Apart>)
    conv2_forward_tile_moments_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K,
                                    float* moment_parts) {
    conv3x3_image_tile<Precision::Fp32, TileForm::Apart, float, float, true>(x, forward_quads, y, C, K, N,
                                                                             moment_parts);
}

// The 3xTF32 forward in the input gradient's stacked form, 32 output channels per block: twice the blocks
// of the form above, for small batches, where those leave SMs idle; weights staged with forward_stacked.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<TileForm::Stacked>)
    conv2_forward_stacked_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K,
                               int images_per_model) {
    conv3x3_image_tile<Precision::Fp32, TileForm::Stacked>(x, forward_quads, y, C, K, images_per_model);
}

// grid (models * N, ceil(C / tile channels), CONV2_SIZE / CONV_ROWS), as the forward; dy and dx in conv2_stored<P>
template <Precision P>
__global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<tile_form<P, true>>)
    conv2_backward_input_fast(const conv2_stored<P>* dy, const float4* input_grad_quads, conv2_stored<P>* dx, int N,
                              int C, int K, int images_per_model) {
    conv3x3_image_tile<P, tile_form<P, true>>(dy, input_grad_quads, dx, K, C, images_per_model);
}

// The 3xTF32 input gradient in the paired form, for large batches (five products per kernel row instead of
// six, three blocks per SM instead of four); weights staged with input_grad_paired.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<TileForm::Paired>)
    conv2_backward_input_paired_fast(const float* dy, const float4* input_grad_quads, float* dx, int N, int C, int K,
                                     int images_per_model) {
    conv3x3_image_tile<Precision::Fp32, TileForm::Paired>(dy, input_grad_quads, dx, K, C, images_per_model);
}

// The forward's persistent form (conv3x3_image_tiles_persistent), in plain TF32 and bf16, for one model: grid (at
// most N * CONV2_SIZE / CONV_ROWS, ceil(K / tile channels)), CONV_THREADS threads, CONV_PERSISTENT_BLOCKS_PER_SM
// blocks per SM (three: the output's own region of shared memory makes a block too large for four); the ops module
// sizes the grid with it.
#if !defined(CONV_PERSISTENT_BLOCKS_PER_SM)
#error "compile through mnist_cuda.ops, which passes the persistent blocks per SM as a -D option"
#endif
// MOMENTS: each block also writes the (mean, M2) of its output's channels into moment_parts [K, gridDim.x, 2],
// for BN2's statistics (batchnorm_stats_from_parts_fast, fast/3_bn_relu_pool.cu, merges them): no pass of its
// own over y.
template <Precision P, bool MOMENTS>
__global__ void __launch_bounds__(CONV_THREADS, CONV_PERSISTENT_BLOCKS_PER_SM)
    conv2_forward_persistent_fast(const conv2_stored<P>* x, const float4* forward_quads, conv2_stored<P>* y, int N,
                                  int C, int K, float* moment_parts) {
    conv3x3_image_tiles_persistent<P, tile_form<P, false>, MOMENTS>(x, forward_quads, y, N, C, K, moment_parts);
}

// The 3xTF32 forward as a block of two warpgroups with the weights resident (conv3x3_image_tiles_warpgroup_pair), for
// one model: grid (at most N * CONV2_SIZE / CONV_ROWS / 2, ceil(K / tile channels)), 2 * CONV_THREADS threads, one
// block per SM (its shared memory: every chunk's weights, and two image buffers and an output region per warpgroup).
// The bits of conv2_forward_fast<Precision::Fp32>, and with MOMENTS conv2_forward_tile_moments_fast's moment_parts.
template <bool MOMENTS>
__global__ void __launch_bounds__(2 * CONV_THREADS, 1)
    conv2_forward_warpgroup_pair_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K,
                                      float* moment_parts) {
    conv3x3_image_tiles_warpgroup_pair<MOMENTS>(x, forward_quads, y, N, C, K, moment_parts);
}

// The warpgroup pair with a producer warpgroup staging each consumer's chunks (conv3x3_image_tiles_warp_specialized):
// grid and shared memory as conv2_forward_warpgroup_pair_fast's, 4 * CONV_THREADS threads; the same bits.
template <bool MOMENTS>
__global__ void __launch_bounds__(4 * CONV_THREADS, 1)
    conv2_forward_warp_specialized_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K,
                                        float* moment_parts) {
    conv3x3_image_tiles_warp_specialized<MOMENTS>(x, forward_quads, y, N, C, K, moment_parts);
}

// grid (parts, ceil(K / WGRAD_OUT), models * ceil(C / WGRAD_CHANNELS)), WGRAD_THREADS threads, dynamic shared
// memory; N: one model's batch; x, dy: [models][N][..]; partial [models][parts][K][C][3][3] (with one part and
// one model: dw itself); x and dy in conv2_stored<P>. L2_PREFETCH false: the staging's loads without the L2's
// 256-byte fetch (the ladder's rung below the product). FROM_LAYOUT: x and dy in the weight gradient's layout
// (conv2_weight_grad_layout_fast)
template <Precision P, bool L2_PREFETCH = true, bool FROM_LAYOUT = false>
__global__ void __launch_bounds__(WGRAD_THREADS, 1)
    conv2_backward_weight_fast(const conv2_stored<P>* x, const conv2_stored<P>* dy, float* partial, int N, int C, int K,
                               int items_per_part) {
    conv3x3_weight_grad_rows<P, L2_PREFETCH, FROM_LAYOUT>(x, dy, partial, N, C, K, items_per_part);
}

// grid (ceil(N / wgrad_images) x ceil(channels / 8) tasks, 1, models), WGRAD_LAYOUT_THREADS threads; src
// [models][N][channels][14][14] -> dst [models][groups][196][channels][wgrad_images], in conv2_stored<P>
template <Precision P>
__global__ void __launch_bounds__(WGRAD_LAYOUT_THREADS)
    conv2_weight_grad_layout_fast(const conv2_stored<P>* src, conv2_stored<P>* dst, int N, int channels) {
    to_weight_grad_layout<P>(src, dst, N, channels);
}
