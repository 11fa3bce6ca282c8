// 2_conv2_tile_forms.cuh: how conv2's forward and input gradient lay out their matrix products, shared by the
// image tiles that multiply (2_conv2_image_tile.cuh) and the weight staging that writes operand A
// (2_conv2_stage_weights.cuh): the launch geometry, the forms of A (TileForm) and the products of a k-step.
// Part of the fast form of conv2d_forward_naive and conv2d_backward_input_naive (naive/2_conv2d.cu).
//
// Both are the same operation, a 3x3 convolution of a stack of 14x14 images:
//   out[img, n, p] = sum_{c, tap} in[img, c, p + shift(tap)] * wt(n, c, tap)
// forward: in = x, wt(n, c, tap) = w[n, c, tap]; input gradient: in = dy, wt(n, c, tap) = w[c, n, 8 - tap]
// (the flipped kernel, with w's two channel indices swapped).
//
// A block computes tile_channels output channels (rows) of CONV_ROWS image rows (columns) as a matrix
// product on the tensor cores (tensor_core.cuh; in 3xTF32, each channel's two weight parts as rows of A,
// below). Columns are positions on the 16-wide grid of the image with its zero border, not pixels: column j
// is output pixel (j / 16, j % 16); columns 14 and 15 of each grid row are computed and dropped. Column j's
// window then starts at staged pixel j, so for tap (tr, tc) the block's operand B is the staged image
// itself, read from pixel 16 tr + tc on: a shifted start address, no im2col copy and no index arithmetic.
//
// The input passes through shared memory CONV_CHUNK channels at a time (k = 8 channels per tap, 9 taps
// per chunk), split into its TF32 parts: planes [part][channel quad][pixel][4 channels].
// A holds the chunk's weights, also split, in one of three forms (TileForm below). 3xTF32 needs three
// products per k-step, big*big, big*small and small*big; the tensor cores multiply 64 rows of A at a time.
// - The forward (64 output channels) keeps the parts *apart*: rows 0-63 of A the big parts of the 64
//   channels' weights, rows 64-127 their small parts. A k-step is three m64 products into one set of
//   accumulators: small (rows 64-127) * B_big, big (rows 0-63) * B_small, big * B_big. Three products for
//   3xTF32's three, and every row one channel. Its weights take twice the shared memory of the other forms,
//   so they have one buffer, not two: the next chunk's weights are copied in once the products are done.
// - The input gradient (32 output channels) *stacks* them: rows 0-31 the big parts, rows 32-63 the
//   small parts. Two products per k-step, A * B_big and A * B_small, give big*big and big*small in rows
//   0-31 and small*big (and the unneeded small*small) in rows 32-63: 32 channels are too few for 64 rows
//   of one part, which would leave half of them zero. Rows c and c + 32 are added at the end. Small
//   batches take the forward in this form too (conv2_forward_stacked_fast): twice the blocks, where 64
//   channels per block would leave SMs idle.
// - Large batches take the input gradient *paired* (conv2_backward_input_paired_fast): stacked, but a
//   kernel row's three taps share their weights' layout, so that one product can hold the big parts of
//   two taps, as rows 0-31 and 32-63, times B_small read from the first tap's pixel. Rows 32-63 then hold
//   the second tap's big*small for the output pixel one to the left of their column; they go into a
//   second set of accumulators, moved into place at the end. Five products per kernel row instead of six
//   (the unneeded small*small is left out for two taps of three), but the second set of 56 accumulators
//   takes the kernel from 110 to 157 registers: three blocks per SM instead of four.
//
// Shared memory layouts are wgmma's "K-major, no swizzle": 8 rows x 16 bytes (4 k) core matrices.
// B: a plane holds a channel quad's pixels at 16 bytes each, so core matrices are 8 consecutive pixels
// (128 bytes apart along the columns) and the second quad is the next plane; a tap's shift moves the
// start address by whole pixels (16 bytes, wgmma's granularity). A: [tap][channel quad][row][4], and in
// the paired form [kernel row][channel quad][row][4].
#pragma once
#include "common.cuh"
#include "tensor_core.cuh"

// Geometry, from mnist_cuda/ops/conv2_implicit_gemm.py (NVRTC -D options): CONV2_SIZE (14, conv2's
// images), CONV_THREADS (one warpgroup: 4 warps x 16 rows), CONV_TILE_CHANNELS output channels per block
// (the forward in every precision; the input gradient in Precision::Tf32 and Bf16, a row per output
// channel) and CONV_TILE_CHANNELS_STACKED (the input gradient in Precision::Fp32), CONV_CHUNK input
// channels per step (x 9 taps = 72 k = 9 k-steps), CONV_ROWS grid rows per block (half the image, so 112
// columns; a block per whole image was slower at batch 64 and 512 alike). The ops module sizes the block's
// dynamic shared memory too (two buffers of the staged image and of the chunk's weights, one in the apart
// form, whose chunks are twice as large; the accumulators at the end), from CONV_STAGED_PIXELS and
// CONV_CHUNK_QUADS, which must be staged_pixels and the quads of a chunk of 64 rows of A derived here.
#if !defined(CONV2_SIZE) || !defined(CONV_THREADS) || !defined(CONV_TILE_CHANNELS) ||             \
    !defined(CONV_TILE_CHANNELS_STACKED) || !defined(CONV_CHUNK) || !defined(CONV_CHUNK_QUADS) || \
    !defined(CONV_ROWS) || !defined(CONV_STAGED_PIXELS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define CONV_PADDED 16  // the staged grid is 16 wide: the image with its zero border
// The staged image's pixels per plane: the block's CONV_ROWS grid rows, a border row above and below, and
// the 2 pixels past them that the last column's last tap, (2, 2), reads. (An enum, not a constexpr
// variable: NVRTC emits each namespace-scope variable that device code names into the module as a global,
// which nothing reads.)
enum StagedImageGeometry : int { staged_pixels = (CONV_ROWS + 2) * CONV_PADDED + 2 };
static_assert(CONV_STAGED_PIXELS == staged_pixels, "the ops module sizes shared memory with the staged pixels");
static_assert(CONV_CHUNK_QUADS == 9 * 2 * 64, "the ops module sizes shared memory with 9 taps x 2 quads x 64 rows");

// The type conv2's input, its output and their gradients are stored in between stages at precision PR: bf16 in
// Bf16, as torch.autocast stores a convolution's operands, output and gradients (half the bytes of every pass over
// them; the products round their operands to bf16 anyway, so they see the same values; the input gradient, which
// conv1's backward reads, is rounded once more), float32 otherwise.
// pair: a pixel pair of them as one load (two floats, or a bf16 pair's bits).
template <Precision PR>
struct Conv2Stored {
    using type = float;
    using pair = float2;
};
template <>
struct Conv2Stored<Precision::Bf16> {
    using type = bfloat16;
    using pair = unsigned;
};
template <Precision PR>
using conv2_stored = typename Conv2Stored<PR>::type;

// How A holds the block's output channels (above): Apart, Stacked and Paired in 3xTF32 (Precision::Fp32),
// OnePart (a row per channel, rounded) in the others.
enum class TileForm { Apart, Stacked, Paired, OnePart };
template <Precision PR, bool FLIPPED>  // FLIPPED: the input gradient
constexpr TileForm tile_form = PR != Precision::Fp32 ? TileForm::OnePart
                               : FLIPPED             ? TileForm::Stacked
                                                     : TileForm::Apart;
// Output channels per block, rows of A per tap (a row holds one part of one channel), weight quads per
// chunk (9 taps x 2 channel quads x the rows), buffers of them, and the accumulator sets.
template <TileForm F>
constexpr int tile_channels =
    F == TileForm::Stacked || F == TileForm::Paired ? CONV_TILE_CHANNELS_STACKED : CONV_TILE_CHANNELS;
template <TileForm F>
constexpr int a_rows = F == TileForm::Apart ? 128 : 64;
template <TileForm F>
constexpr int chunk_quads = 9 * 2 * a_rows<F>;
template <TileForm F>
constexpr int weight_buffers = F == TileForm::Apart ? 1 : 2;
template <TileForm F>
constexpr int accumulator_sets = F == TileForm::Paired ? 2 : 1;
// A chunk's weights are laid out by groups of taps, [group][channel quad][group_rows]: a tap per group,
// but a kernel row (three taps) in the paired form, whose products mix taps.
template <TileForm F>
constexpr int group_taps = F == TileForm::Paired ? 3 : 1;
template <TileForm F>
constexpr int group_rows = a_rows<F> * group_taps<F>;
// The paired form's 192 rows of a kernel row are six runs of 32 (a part of the 32 channels at one tap):
// the small parts of column 0, the big parts of columns 0 and 1, the small parts of column 1, the big
// and small parts of column 2. So each column's two parts are 64 consecutive rows, and so are the big
// parts of columns 0 and 1.
__host__ __device__ constexpr int paired_run_column(int run) { return run < 2 ? 0 : run < 4 ? 1 : 2; }
__host__ __device__ constexpr bool paired_run_small(int run) { return run == 0 || run == 3 || run == 5; }
// The products of a group, per k-step, in order. Product i multiplies A's 64 rows from row a_row of the group
// by B's part b_part (0 big, 1 small) from the staged pixel `column` to the right of the group's tap, into
// accumulator set `set`.
struct GroupProduct {
    int a_row, b_part, column, set;
};
template <TileForm F>
constexpr int group_products = F == TileForm::Apart     ? 3
                               : F == TileForm::Stacked ? 2
                               : F == TileForm::Paired  ? 5
                                                        : 1;
template <TileForm F>
__host__ __device__ constexpr GroupProduct group_product(int i) {
    if constexpr (F == TileForm::Apart) {
        // the small terms first: they are the least significant
        constexpr GroupProduct products[] = {
            {64, 0, 0, 0},  // small * B_big
            {0, 1, 0, 0},   // big * B_small
            {0, 0, 0, 0},   // big * B_big
        };
        return products[i];
    } else if constexpr (F == TileForm::Stacked) {
        constexpr GroupProduct products[] = {
            {0, 0, 0, 0},  // A * B_big: big*big in rows c, small*big in rows c + 32
            {0, 1, 0, 0},  // A * B_small: big*small, and the unneeded small*small
        };
        return products[i];
    } else if constexpr (F == TileForm::Paired) {  // a group is a kernel row: columns 0, 1, 2 of its taps
        constexpr GroupProduct products[] = {
            {0, 0, 0, 0},    // column 0's two parts * B_big: big*big and small*big
            {64, 0, 1, 0},   // column 1's two parts * B_big
            {128, 0, 2, 0},  // column 2's two parts * B_big
            {128, 1, 2, 0},  // column 2's two parts * B_small (big*small and the unneeded small*small)
            {32, 1, 0, 1},   // the big parts of columns 0 and 1 * B_small from column 0, into the second set
        };
        return products[i];
    } else {
        constexpr GroupProduct products[] = {{0, 0, 0, 0}};  // one part: the one product
        return products[i];
    }
}
// Product i's part and column of B, group_product's b_part and column written as comparisons: as table lookups
// the mma.sync path compiles to other instructions (tile_form_agrees checks that they agree with the table).
template <TileForm F>
__host__ __device__ constexpr int product_b_part(int i) {
    return F == TileForm::Paired ? (i >= 3 ? 1 : 0) : F == TileForm::Apart ? (i == 1 ? 1 : 0) : i;
}
template <TileForm F>
__host__ __device__ constexpr int product_column(int i) {
    return F == TileForm::Paired ? (i == 1 ? 1 : i == 2 || i == 3 ? 2 : 0) : 0;
}
// Where product i of group g reads B: the staged pixel of its tap, counted from the block's first column.
template <TileForm F>
__host__ __device__ constexpr int product_shift(int g, int i) {
    return F == TileForm::Paired ? g * CONV_PADDED + product_column<F>(i) : (g / 3) * CONV_PADDED + g % 3;
}
// Whether product i reads B where the group's last product before it that reads the same part of B does
// (mma.sync then keeps its fragments).
template <TileForm F>
__host__ __device__ constexpr bool reads_previous_b(int i) {
    for (int k = i - 1; k >= 0; k--)
        if (product_b_part<F>(k) == product_b_part<F>(i)) return product_column<F>(k) == product_column<F>(i);
    return false;
}
// Form F's numbers agree with each other: A's rows per tap hold each output channel's parts (two in 3xTF32,
// one in the others), a chunk is its groups' two channel quads of group_rows rows each, every product's 64
// rows of A and its accumulator set exist, and product_b_part and product_column say what its table says.
template <TileForm F>
__host__ __device__ constexpr bool tile_form_agrees() {
    if (tile_channels<F> * (F == TileForm::OnePart ? 1 : 2) != group_rows<F> / group_taps<F>) return false;
    if (chunk_quads<F> != 9 / group_taps<F> * 2 * group_rows<F>) return false;
    for (int i = 0; i < group_products<F>; i++)
        if (group_product<F>(i).a_row + 64 > group_rows<F> || group_product<F>(i).set >= accumulator_sets<F> ||
            product_b_part<F>(i) != group_product<F>(i).b_part || product_column<F>(i) != group_product<F>(i).column)
            return false;
    return true;
}
// Input channels per chunk (two 16-byte quads of staged values per pixel).
template <Precision PR>
constexpr int chunk_channels = 2 * staged_values<PR>;
static_assert(CONV_CHUNK == chunk_channels<Precision::Fp32>, "8 channels per chunk in float32's layouts");
// Weight quads of one product in form F (c_in input, c_out output channels): what conv2_stage_weights_fast writes
// per model, and so how far apart the models' staged weights lie.
template <TileForm F, Precision PR>
__host__ __device__ constexpr int product_quads(int c_in, int c_out) {
    return CEIL_DIV(c_out, tile_channels<F>) * CEIL_DIV(c_in, chunk_channels<PR>) * chunk_quads<F>;
}
static_assert(CONV_TILE_CHANNELS == 64 && CONV_TILE_CHANNELS_STACKED == 32, "A's forms hold 64 or 32 channels");
// Dynamic shared memory of an image tile: the staged image's two buffers, then the weights'.
constexpr int image_planes_bytes = 2 * 4 * staged_pixels * 16;
template <TileForm F>
constexpr int image_tile_bytes = image_planes_bytes + weight_buffers<F> * chunk_quads<F> * 16;
