// 2_conv2_stage_weights.cuh: stage_weights, the work of conv2_stage_weights_fast: conv2's weights as its image
// tiles read them (2_conv2_image_tile.cuh), split into their parts and laid out in a TileForm
// (2_conv2_tile_forms.cuh), written once per step for the forward and the input gradient. It takes the weight
// reads out of conv2d_forward_naive and conv2d_backward_input_naive (naive/2_conv2d.cu), which read w per
// multiply-add.
#pragma once
#include "common.cuh"
#include "2_conv2_tile_forms.cuh"

// Weight quad q (16 bytes) of a product with Cin input and Cout output channels:
// [tile][chunk][group][quad][row], row one of the group's rows (group_rows), holding channels
// chunk * 8 + quad * 4 + 0..3 of output channel tile * TILE + row % TILE (TILE: tile_channels). In the apart
// and stacked forms the group is a tap, with the big TF32 parts in rows < TILE and the small parts in the
// others; in the paired form it is a kernel row, in the six runs of 32 rows above. Channels past Cin and
// past Cout are zeros. In plain TF32: output channel tile * 64 + row, rounded to the nearest TF32. In bf16:
// channels chunk * 16 + quad * 8 + 0..7 of output channel tile * 64 + row, rounded to the nearest bf16.
template <bool FLIPPED, Precision PR, TileForm F>
__device__ __forceinline__ void stage_weight_quad(const float* w, int Cin, int Cout, float4* quads, int q) {
    constexpr int TILE = tile_channels<F>, ROWS = group_rows<F>, QUADS = chunk_quads<F>;
    constexpr int VALUES = staged_values<PR>, CHUNK = chunk_channels<PR>;
    const int chunks = CEIL_DIV(Cin, CHUNK), row = q % ROWS, quad = q / ROWS % 2;
    const int group = q / (2 * ROWS) % (9 / group_taps<F>);
    const int chunk = q / QUADS % chunks, tile = q / (QUADS * chunks);
    const int n = tile * TILE + row % TILE;
    const int tap = F == TileForm::Paired ? 3 * group + paired_run_column(row / TILE) : group;
    const bool small_part = F == TileForm::Paired ? paired_run_small(row / TILE) : row >= TILE;
    float v[VALUES];
#pragma unroll
    for (int i = 0; i < VALUES; i++) {
        const int c = chunk * CHUNK + quad * VALUES + i;
        // forward: w[n, c, tap]; input gradient: w[c, n, 8 - tap]
        v[i] = c < Cin && n < Cout ? (FLIPPED ? w[(c * Cout + n) * 9 + 8 - tap] : w[(n * Cin + c) * 9 + tap]) : 0.0f;
    }
    float4 big, small;
    stage16<PR>(v, &big, &small);
    quads[q] = small_part ? small : big;
}

// Quad q of one product's weights in form F, if q is one of them; else q less their number. The product's
// buffer holds the models' weights one after another, [model][product_quads].
template <bool FLIPPED, Precision PR, TileForm F>
__device__ __forceinline__ bool stage_product_quad(const float* w, int Cin, int Cout, float4* quads, int model,
                                                   int& q) {
    const int count = product_quads<F, PR>(Cin, Cout);
    if (q < count) stage_weight_quad<FLIPPED, PR, F>(w, Cin, Cout, model_part(quads, count, model), q);
    q -= count;
    return q < 0;
}

// The weights of both products from w [K, C, 3, 3], one thread per float4 of a model (the grid's z): forward_quads
// (C in, K out) first, in the stacked form if forward_stacked (3xTF32 only: conv2_forward_stacked_fast reads
// them), then input_grad_quads (K in, C out; flipped), in the paired form if input_grad_paired (3xTF32 only:
// conv2_backward_input_paired_fast reads them). Model m's w is param_stride floats after model 0's.
template <Precision PR>
__device__ __forceinline__ void stage_weights(const float* w, int C, int K, float4* forward_quads,
                                              float4* input_grad_quads, int forward_stacked, int input_grad_paired,
                                              int param_stride) {
    const int model = model_index();
    w = model_part(w, param_stride, model);
    int q = blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (PR == Precision::Fp32) {
        const bool forward_done =
            forward_stacked ? stage_product_quad<false, PR, TileForm::Stacked>(w, C, K, forward_quads, model, q)
                            : stage_product_quad<false, PR, TileForm::Apart>(w, C, K, forward_quads, model, q);
        if (forward_done) return;
        if (input_grad_paired)
            stage_product_quad<true, PR, TileForm::Paired>(w, K, C, input_grad_quads, model, q);
        else
            stage_product_quad<true, PR, TileForm::Stacked>(w, K, C, input_grad_quads, model, q);
        return;
    }
    if (!stage_product_quad<false, PR, tile_form<PR, false>>(w, C, K, forward_quads, model, q))
        stage_product_quad<true, PR, tile_form<PR, true>>(w, K, C, input_grad_quads, model, q);
}
