// conv2_implicit_gemm.cu: conv2 (3x3, stride 1, zero padding 1, no bias, 14x14 images) as matrix products
// on the tensor cores: the fast form of naive/conv2d.cu for conv2. The spatial size is a compile-time
// constant, so the index arithmetic is multiplies and shifts, not divisions.
#include "common.cuh"
#include "tensor_core.cuh"

// ---- forward and input gradient: one image per block, the image staged in shared memory ----------
//
// Both are the same operation, a 3x3 convolution of a stack of 14x14 images:
//   out[img, n, p] = sum_{c, tap} in[img, c, p + shift(tap)] * wt(n, c, tap)
// forward: in = x, wt(n, c, tap) = w[n, c, tap]; input gradient: in = dy, wt(n, c, tap) = w[c, n, 8 - tap]
// (the flipped kernel, with w's two channel indices swapped).
//
// A block computes tile_channels output channels (rows) of CONV_ROWS image rows (columns) as a matrix
// product on the tensor cores (tensor_core.cuh; in 3xTF32, each channel's two weight parts as rows of A,
// below). Columns are positions on the 16-wide grid of
// the image with its zero border, not pixels: column j is output pixel (j / 16, j % 16); columns 14 and 15
// of each grid row are computed and dropped. Column j's window then starts at staged pixel j, so for
// tap (tr, tc) the block's operand B is the staged image itself, read from pixel 16 tr + tc on: a
// shifted start address, no im2col copy and no index arithmetic at all.
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
// On Hopper (sm_90a) a product is one warpgroup MMA (wgmma) of 64 rows x all the block's columns x
// 8 k, both operands read by the tensor cores from shared memory: a chunk is 9, 15, 18 or 27 instructions
// with nothing between them, and the next chunk's image is fetched and staged while they run. On other
// GPUs the same products are mma.sync (m16n8k8) with the fragments loaded from the same shared memory.
//
// Shared memory layouts are wgmma's "K-major, no swizzle": 8 rows x 16 bytes (4 k) core matrices.
// B: a plane holds a channel quad's pixels at 16 bytes each, so core matrices are 8 consecutive pixels
// (128 bytes apart along the columns) and the second quad is the next plane; a tap's shift moves the
// start address by whole pixels (16 bytes, wgmma's granularity). A: [tap][channel quad][row][4], and in
// the paired form [kernel row][channel quad][row][4].
// Geometry, from mnist_cuda/ops/conv2_implicit_gemm.py (NVRTC -D options): CONV2_SIZE (14, conv2's
// images), CONV_THREADS (one warpgroup: 4 warps x 16 rows), CONV_TILE_CHANNELS output channels per block
// (the forward in every precision; the input gradient in Precision::Tf32 and Bf16, a row per output
// channel) and CONV_TILE_CHANNELS_STACKED (the input gradient in Precision::Fp32), CONV_CHUNK input
// channels per step (x 9 taps = 72 k = 9 k-steps), CONV_CHUNK_QUADS weight float4s per chunk and 64 rows
// of A (9 taps x 2 channel quads x 64 rows), CONV_ROWS grid rows per block (half the image, so 112
// columns; a block per whole image was slower at batch 64 and 512 alike), CONV_STAGED_PIXELS (the block's
// rows and a border row above and below, and 2 pixels that the last column's last tap reads). The block's
// dynamic shared memory is sized there too: two buffers of the staged image and of the chunk's weights
// (one in the apart form, whose chunks are twice as large), the accumulators at the end.
#if !defined(CONV2_SIZE) || !defined(CONV_THREADS) || !defined(CONV_TILE_CHANNELS) ||             \
    !defined(CONV_TILE_CHANNELS_STACKED) || !defined(CONV_CHUNK) || !defined(CONV_CHUNK_QUADS) || \
    !defined(CONV_ROWS) || !defined(CONV_STAGED_PIXELS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define CONV_PADDED 16  // the staged grid is 16 wide: the image with its zero border


// How A holds the block's output channels (above): Apart, Stacked and Paired in 3xTF32 (Precision::Fp32),
// OnePart (a row per channel, rounded) in the others.
enum class TileForm { Apart, Stacked, Paired, OnePart };
template <Precision PR, bool FLIPPED>  // FLIPPED: the input gradient
constexpr TileForm tile_form = PR != Precision::Fp32 ? TileForm::OnePart
                               : FLIPPED             ? TileForm::Stacked
                                                     : TileForm::Apart;
// Output channels per block, rows of A per tap (a row holds one part of one channel), weight quads per
// chunk, buffers of them, and the accumulator sets.
template <TileForm F>
constexpr int tile_channels =
    F == TileForm::Stacked || F == TileForm::Paired ? CONV_TILE_CHANNELS_STACKED : CONV_TILE_CHANNELS;
template <TileForm F>
constexpr int a_rows = F == TileForm::Apart ? 128 : 64;
template <TileForm F>
constexpr int chunk_quads = CONV_CHUNK_QUADS / 64 * a_rows<F>;
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
// The products of a group, per k-step. Product i multiplies A's 64 rows from row product_a_row(i) of the
// group by B's part product_b_part(i) (0 big, 1 small) from the staged pixel product_column(i) to the
// right of the group's tap, into accumulator set product_set(i).
// - Apart: small * B_big, big * B_small, big * B_big (the small terms first: they are the least significant).
// - Stacked: A * B_big, A * B_small.
// - Paired, per kernel row: each column's two parts * B_big (big*big and small*big, rows c and c + 32),
//   column 2's two parts * B_small (big*small and the unneeded small*small), and the big parts of columns
//   0 and 1 together * B_small from column 0, into the second set.
// - One part: the one product.
template <TileForm F>
constexpr int group_products = F == TileForm::Apart     ? 3
                               : F == TileForm::Stacked ? 2
                               : F == TileForm::Paired  ? 5
                                                        : 1;
template <TileForm F>
__host__ __device__ constexpr int product_a_row(int i) {
    return F == TileForm::Paired            ? (i == 0   ? 0
                                               : i == 1 ? 64
                                               : i == 4 ? 32
                                                        : 128)
           : F == TileForm::Apart && i == 0 ? 64
                                            : 0;
}
template <TileForm F>
__host__ __device__ constexpr int product_b_part(int i) {
    return F == TileForm::Paired ? (i >= 3 ? 1 : 0) : F == TileForm::Apart ? (i == 1 ? 1 : 0) : i;
}
template <TileForm F>
__host__ __device__ constexpr int product_column(int i) {
    return F == TileForm::Paired ? (i == 1 ? 1 : i == 2 || i == 3 ? 2 : 0) : 0;
}
template <TileForm F>
__host__ __device__ constexpr int product_set(int i) {
    return F == TileForm::Paired && i == 4 ? 1 : 0;
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
// Input channels per chunk (two 16-byte quads of staged values per pixel).
template <Precision PR>
constexpr int chunk_channels = 2 * staged_values<PR>;
static_assert(CONV_CHUNK == chunk_channels<Precision::Fp32>, "8 channels per chunk in float32's layouts");
static_assert(CONV_CHUNK_QUADS == 9 * 2 * 64, "a chunk's weights: 9 taps x 2 quads x 64 rows of A");
static_assert(CONV_TILE_CHANNELS == 64 && CONV_TILE_CHANNELS_STACKED == 32, "A's forms hold 64 or 32 channels");
// Dynamic shared memory of an image tile: the staged image's two buffers, then the weights'.
constexpr int image_planes_bytes = 2 * 4 * CONV_STAGED_PIXELS * 16;
template <TileForm F>
constexpr int image_tile_bytes = image_planes_bytes + weight_buffers<F> * chunk_quads<F> * 16;

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

template <Precision PR, TileForm FORM>
__device__ __forceinline__ void conv3x3_image_tile(const float* in, const float4* quads, float* out, int Cin,
                                                   int Cout) {
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, ROWS = CONV_ROWS, N = ROWS * P;  // N: columns
    constexpr int PLANE = CONV_STAGED_PIXELS * 4;                        // floats per (part, quad)
    constexpr int IN_PIXELS = (ROWS + 2) * S, IN_TASKS = 2 * IN_PIXELS;  // per chunk: (quad, pixel)
    constexpr int IN_PER_THREAD = CEIL_DIV(IN_TASKS, CONV_THREADS), ACC_STRIDE = N + 8;
    constexpr int TILE = tile_channels<FORM>, GROUP_ROWS = group_rows<FORM>, QUADS = chunk_quads<FORM>;
    constexpr int GROUPS = 9 / group_taps<FORM>, PRODUCTS = group_products<FORM>, SETS = accumulator_sets<FORM>;
    constexpr int VALUES = staged_values<PR>, CHUNK = chunk_channels<PR>;
    static_assert((FORM == TileForm::OnePart) == (PR != Precision::Fp32), "two parts exactly in 3xTF32");
    static_assert(64 * ACC_STRIDE * 4 <= image_tile_bytes<FORM>, "the accumulators fit");
    extern __shared__ float4 conv_shared[];
    float* in_s = reinterpret_cast<float*>(conv_shared);  // [buffer][part][quad][pixel][4]
    float4* w_s = conv_shared + 2 * 4 * PLANE / 4;        // [weight_buffers][QUADS]
    const int img = blockIdx.x, n0 = blockIdx.y * TILE, r0 = blockIdx.z * ROWS;
    const int chunks = CEIL_DIV(Cin, CHUNK), tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    const float* x = in + (size_t)img * Cin * SS;
    const float4* block_quads = quads + (size_t)blockIdx.y * chunks * QUADS;

    for (int i = tid; i < 2 * PLANE; i += CONV_THREADS)  // both buffers; the border stays zero
        conv_shared[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    // in_next[r]: channels VALUES * quad .. + VALUES - 1 of the chunk at pixel p of the block's input rows (image rows
    // r0 - 1 .. r0 + ROWS), task e = quad * IN_PIXELS + p; rows outside the image stay zero.
    float in_next[IN_PER_THREAD][VALUES];
    auto fetch_image = [&](int chunk) {  // the image's chunk into registers (zeros past Cin)
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, p = e % IN_PIXELS, row = r0 - 1 + p / S;
            const bool inside = e < IN_TASKS && row >= 0 && row < S;
#pragma unroll
            for (int i = 0; i < VALUES; i++) {
                const int c = chunk * CHUNK + VALUES * (e / IN_PIXELS) + i;
                in_next[r][i] = inside && c < Cin ? x[c * SS + row * S + p % S] : 0.0f;
            }
        }
    };
    auto fetch_weights = [&](int chunk) {  // the chunk's weights by cp.async into their buffer
        float4* dst = w_s + chunk % weight_buffers<FORM> * QUADS;
        for (int e = tid; e < QUADS; e += CONV_THREADS)
            cp_async16(reinterpret_cast<float*>(dst + e),
                       reinterpret_cast<const float*>(block_quads + chunk * QUADS + e));
    };
    auto stash = [&](int buffer) {  // the registers into shared memory, split, inside the border
        float* planes = in_s + buffer * 4 * PLANE;
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, p = e % IN_PIXELS, quad = e / IN_PIXELS;
            if (e < IN_TASKS) {
                const int pixel = (p / S) * P + p % S + 1;
                stage16<PR>(in_next[r], reinterpret_cast<float4*>(planes + quad * PLANE + pixel * 4),
                            reinterpret_cast<float4*>(planes + (2 + quad) * PLANE + pixel * 4));
            }
        }
    };

    float acc[SETS][N / 2] = {};
    fetch_image(0);
    fetch_weights(0);
    __syncthreads();  // the zeros are written before any stash
    stash(0);
    for (int chunk = 0; chunk < chunks; chunk++) {
        const int buffer = chunk % 2;
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();  // this chunk is staged; everyone is done with the other buffer
        const float* b_planes = in_s + buffer * 4 * PLANE;
        const float4* a_chunk = w_s + chunk % weight_buffers<FORM> * QUADS;
        // staged while the tensor cores work: the next chunk's image, and its weights where they have a
        // buffer of their own
        auto stage_next = [&] {
            if (chunk + 1 < chunks) {
                fetch_image(chunk + 1);
                if (weight_buffers<FORM> == 2) fetch_weights(chunk + 1);
                stash(1 - buffer);
            }
        };
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        wgmma_fence();
#pragma unroll
        for (int grp = 0; grp < GROUPS; grp++) {  // A at a_chunk[grp * 2 * GROUP_ROWS]
#pragma unroll
            for (int i = 0; i < PRODUCTS; i++) {
                const unsigned long long a =
                    wgmma_descriptor(a_chunk + grp * 2 * GROUP_ROWS + product_a_row<FORM>(i), GROUP_ROWS * 16, 128);
                const unsigned long long b = wgmma_descriptor(
                    b_planes + 2 * product_b_part<FORM>(i) * PLANE + product_shift<FORM>(grp, i) * 4, PLANE * 4, 128);
                if constexpr (PR == Precision::Bf16)
                    wgmma_bf16<N>(acc[product_set<FORM>(i)], a, b);
                else
                    wgmma_tf32<N>(acc[product_set<FORM>(i)], a, b);
            }
        }
        wgmma_commit();
        stage_next();
        wgmma_wait_all();
#else
        // this warp's 16 rows x all N columns, one mma per 8 columns, the products of B's big part first
        const int lane = tid % 32;
#pragma unroll
        for (int grp = 0; grp < GROUPS; grp++) {
            // ldmatrix tile m = lane / 8, row lane % 8. A: tiles (quad 0, rows 0-7), (quad 0, rows 8-15),
            // (quad 1, rows 0-7), (quad 1, rows 8-15) of the warp's 16 rows of product i are mma's a[i][0..3]
            unsigned a[PRODUCTS][4];
#pragma unroll
            for (int i = 0; i < PRODUCTS; i++)
                ldmatrix_x4(a[i], reinterpret_cast<const float*>(a_chunk + grp * 2 * GROUP_ROWS) +
                                      ((lane / 16) * GROUP_ROWS + product_a_row<FORM>(i) + 16 * warp + lane % 16) * 4);
#pragma unroll
            for (int part = 0; part < (FORM == TileForm::OnePart ? 1 : 2); part++)
#pragma unroll
                for (int j = 0; j < N / 8; j += 2) {
                    // B: tiles (quad 0, columns 8j..), (quad 1, 8j..), (quad 0, 8j + 8..), (quad 1, 8j + 8..):
                    // b[0..1] of columns 8j.. and of 8j + 8..
                    unsigned b[4];
#pragma unroll
                    for (int i = 0; i < PRODUCTS; i++) {
                        if (product_b_part<FORM>(i) != part) continue;
                        if (!reads_previous_b<FORM>(i))
                            ldmatrix_x4(b, b_planes + (2 * part + lane / 8 % 2) * PLANE +
                                               (8 * (j + lane / 16) + lane % 8 + product_shift<FORM>(grp, i)) * 4);
                        float* d = acc[product_set<FORM>(i)];
                        if constexpr (PR == Precision::Bf16) {  // the same tiles: 16-byte rows of 8 k
                            mma_bf16(d + 4 * j, a[i], b);
                            mma_bf16(d + 4 * j + 4, a[i], b + 2);
                        } else {
                            mma_tf32(d + 4 * j, a[i], b);
                            mma_tf32(d + 4 * j + 4, a[i], b + 2);
                        }
                    }
                }
        }
        stage_next();
#endif
        if (weight_buffers<FORM> == 1 && chunk + 1 < chunks) {
            __syncthreads();  // every warp's products are done with the weights' one buffer
            fetch_weights(chunk + 1);
        }
    }

    // acc[set][4j + r] = D(row 16 * warp + g + 8 * (r / 2), column 8j + 2t + r % 2). In the paired form the
    // second set goes into the first: its rows 0-31 as they are, its rows 32-63 (warps 2 and 3) one column
    // to the left, where their output pixels are: column 8j + 2t + 1 takes column 8j + 2t + 2 from the next
    // lane (t = 3: column 8j + 8 from lane t = 0).
    if constexpr (SETS == 2) {
        if (warp < 2) {
#pragma unroll
            for (int e = 0; e < N / 2; e++) acc[0][e] += acc[1][e];
        } else {
#pragma unroll
            for (int j = 0; j < N / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float next_j = j + 1 < N / 8 ? acc[1][4 * (j + 1) + 2 * h] : 0.0f;
                    const float right =
                        __shfl_sync(0xffffffffu, t == 0 ? next_j : acc[1][4 * j + 2 * h], (tid & 28) | ((t + 1) & 3));
                    acc[0][4 * j + 2 * h] += acc[1][4 * j + 2 * h + 1];
                    acc[0][4 * j + 2 * h + 1] += right;
                }
        }
    }
    // Rows c and c + 32 in the stacked and paired forms (both hold parts of channel c's sums; in the others,
    // row c alone) added through shared memory, then written out coalesced.
    __syncthreads();                                       // every product is done: the staging slots are free
    float* acc_s = reinterpret_cast<float*>(conv_shared);  // [64][ACC_STRIDE]: the 4 rows of a half-warp's
    // float2 stores start 8 banks apart (120 = -8 mod 32), so they have no bank conflicts
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            *reinterpret_cast<float2*>(&acc_s[(16 * warp + g + 8 * h) * ACC_STRIDE + 8 * j + 2 * t]) =
                make_float2(acc[0][4 * j + 2 * h], acc[0][4 * j + 2 * h + 1]);
    __syncthreads();
    float* y = out + (size_t)img * Cout * SS + r0 * S;
    for (int e = tid; e < TILE * ROWS * S; e += CONV_THREADS) {
        const int c = e / (ROWS * S), p = e % (ROWS * S), column = (p / S) * P + p % S;
        if (n0 + c >= Cout) continue;
        const float* d = acc_s + column;
        y[(n0 + c) * SS + p] = TILE == 32 ? d[c * ACC_STRIDE] + d[(c + 32) * ACC_STRIDE] : d[c * ACC_STRIDE];
    }
}

// ---- weight gradient: rows of four images staged in shared memory ---------------------------------
//
//   dw[o, c, tap] = sum_img sum_p dy[img, o, p] * x[img, c, p + shift(tap)]
// is a matrix product with rows o, columns (c, tap) and k running over the pixels of the images. For
// a tap to be a shifted start address again (as in the forward), a unit of 16 bytes along k must be
// one pixel, so k runs over pixels x 4 images: x and dy are staged as [pixel][channel][4 images].
//
// An item of work is one output row of 4 images (k = 14 pixels x 4 images = 7 k-steps). A block takes
// a run of consecutive items and writes its sums as one partial result, [part, K, C, 3, 3];
// splitk_reduce adds the parts in order (deterministic). An item reads three x rows (with the zero
// border, on the 16-wide grid) and one dy row, split into TF32 parts; consecutive items of an image quad
// share two of the x rows, so the block stages the next item's dy row and its one new x row (three at a
// quad's start) while the tensor cores work on this item. A block has three warpgroups, one per kernel
// row; each multiplies A = dy (64 output channels) by B = x shifted by its three taps.
// A staged pixel holds its channels by octets, each octet's 8 big parts then its 8 small parts
// ([octet][part][8 channels][4 images]: 128 bytes per part, one core matrix), so a part of a staged
// row is every other core matrix. B, one part of the three taps' pixels side by side (a tap is the next
// pixel), is then 96 columns at a constant stride, and a k-step is the three products of 3xTF32 as
// three wgmma m64n96k8: dy_big * x_big into one set of accumulators, dy_big * x_small and dy_small *
// x_big into the other (two m64n192k8 with both parts of x would also do the small * small product, for
// nothing); a channel's two sums are added at the end. Other GPUs run the products as mma.sync.
// Geometry, from mnist_cuda/ops/conv2_implicit_gemm.py: WGRAD_THREADS (3 warpgroups: kernel rows 0, 1, 2;
// 2 parts x 3 taps x 16 accumulators per thread), WGRAD_OUT output channels per block (the 64 rows of A),
// WGRAD_CHANNELS input channels per block (a tap's 32 columns of B, of one part), WGRAD_IMAGES images per
// 16-byte unit of k, WGRAD_X_SLOTS staged x rows (the three an item reads, and up to three for the next
// item); the block's dynamic shared memory (the x rows and two dy rows) is sized there too.
#if !defined(WGRAD_THREADS) || !defined(WGRAD_OUT) || !defined(WGRAD_CHANNELS) || !defined(WGRAD_IMAGES) || \
    !defined(WGRAD_X_SLOTS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
// Images per 16 staged bytes of k: WGRAD_IMAGES float32 values, twice as many in bf16.
template <Precision PR>
constexpr int wgrad_images = PR == Precision::Bf16 ? 2 * WGRAD_IMAGES : WGRAD_IMAGES;

template <Precision PR>
__device__ __forceinline__ void conv3x3_weight_grad_rows(const float* x, const float* dy, float* partial, int N, int C,
                                                         int K, int items_per_part) {
    constexpr bool SPLIT = PR == Precision::Fp32;  // two parts (3xTF32)
    constexpr int IMAGES = wgrad_images<PR>;
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, PAIRS = S / 2;
    constexpr int X_PIXEL = 2 * WGRAD_CHANNELS * 4, DY_PIXEL = 2 * WGRAD_OUT * 4;  // floats: [octet][part][8][4]
    constexpr int X_ROW = P * X_PIXEL, DY_ROW = S * DY_PIXEL;
    constexpr int X_ROW_TASKS = WGRAD_CHANNELS * 8, DY_ROW_TASKS = WGRAD_OUT * 8;
    static_assert(DY_ROW_TASKS + X_ROW_TASKS == 2 * WGRAD_THREADS && X_ROW_TASKS == 2 * 128, "two tasks per thread");
    extern __shared__ float4 conv_shared[];
    float* smem = reinterpret_cast<float*>(conv_shared);  // x: [slot][pixel][part][channel][4]; dy: [slot][pixel]...
    float* dy_slots = smem + WGRAD_X_SLOTS * X_ROW;
    const int o0 = blockIdx.y * WGRAD_OUT, c0 = blockIdx.z * WGRAD_CHANNELS, items = CEIL_DIV(N, IMAGES) * S;
    const int first = blockIdx.x * items_per_part, last = min(items, first + items_per_part);
    const int tid = threadIdx.x, tap_row = tid / 128, warp = tid / 32 % 4, g = tid % 32 / 4, t = tid % 4;
    // Grid row p (image row p - 1) of image quad q lives in x slot (16 q + p) % 6: an item (q, r) reads rows
    // r .. r + 2, and the next item's new rows (r + 3, or rows 0-2 of quad q + 1) are in other slots.
    auto x_slot = [&](int item, int p) { return smem + (P * (item / S) + p) % WGRAD_X_SLOTS * X_ROW; };

    for (int i = tid; i < WGRAD_X_SLOTS * 2 * X_PIXEL / 4;
         i += WGRAD_THREADS) {  // border columns: no stash writes them
        const int slot = i / (2 * X_PIXEL / 4), column = i / (X_PIXEL / 4) % 2 * (P - 1);
        conv_shared[(slot * X_ROW + column * X_PIXEL) / 4 + i % (X_PIXEL / 4)] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    // Staging task f of a row: 2 adjacent pixels (pair f / 8 % 8; pair 7 is past the row) of channel
    // f / 64 * 8 + f % 8, in IMAGES images. 8 lanes take 8 adjacent channels of a pixel pair, so their 16-byte
    // stores fill all 32 banks once, and 4 lane groups read 8 adjacent pixels of a channel. Pixels outside
    // the image and channels or images past the end are zeros.
    auto load = [&](const float* row, int f, int channels_left, int image_stride, bool row_inside, int img0,
                    float2 v[IMAGES]) {
        const int channel = f / 64 * 8 + f % 8, pair = f / 8 % 8;
        const bool inside = row_inside && pair < PAIRS && channel < channels_left;
        const float* src = row + channel * SS + 2 * pair;
#pragma unroll
        for (int i = 0; i < IMAGES; i++)
            v[i] = inside && img0 + i < N ? *reinterpret_cast<const float2*>(src + i * image_stride)
                                          : make_float2(0.0f, 0.0f);
    };
    auto store = [&](float* row, int f, int pixel, const float2 v[IMAGES]) {  // staged, [pixel][octet][part][8][16 B]
        const int pair = f / 8 % 8;
        if (pair >= PAIRS) return;
        float* dst = row + 2 * pair * pixel + f / 64 * 64 + f % 8 * 4;  // octet f / 64's big parts, then its small
        float first[IMAGES], second[IMAGES];
#pragma unroll
        for (int i = 0; i < IMAGES; i++) first[i] = v[i].x, second[i] = v[i].y;
        stage16<PR>(first, reinterpret_cast<float4*>(dst), reinterpret_cast<float4*>(dst + 32));
        stage16<PR>(second, reinterpret_cast<float4*>(dst + pixel), reinterpret_cast<float4*>(dst + pixel + 32));
    };
    // Where the rows of item i and channel offset start: image quad i / 14, and x's row
    // (grid row p, image row p - 1) or dy's row i % 14.
    auto x_row = [&](int item, int p) { return x + ((size_t)(item / S * IMAGES) * C + c0) * SS + (p - 1) * S; };
    auto dy_row = [&](int item) { return dy + ((size_t)(item / S * IMAGES) * K + o0) * SS + item % S * S; };

    // Per item: its dy row and the last of its three x rows (grid row r + 2), two tasks per thread (a
    // dy task, then a dy task in warpgroup 0 or an x task in the others), fetched into registers two
    // items ahead: while the tensor cores work on item i, item i + 1's registers (fetched during item
    // i - 1) are stashed and item i + 2's loads are issued, so their latency passes behind a whole item.
    float2 next[2][IMAGES];
    const int f_dy = tid, f_second = tid < 128 ? WGRAD_THREADS + tid : tid - 128;
    auto fetch = [&](int item) {
        const int img0 = item / S * IMAGES, r = item % S;
        load(dy_row(item), f_dy, K - o0, K * SS, true, img0, next[0]);
        if (tid < 128)
            load(dy_row(item), f_second, K - o0, K * SS, true, img0, next[1]);
        else
            load(x_row(item, r + 2), f_second, C - c0, C * SS, r + 1 < S, img0, next[1]);
    };
    auto stash = [&](int item) {
        float* dy_s = dy_slots + (item - first) % 2 * DY_ROW;
        store(dy_s, f_dy, DY_PIXEL, next[0]);
        if (tid < 128)
            store(dy_s, f_second, DY_PIXEL, next[1]);
        else
            store(x_slot(item, item % S + 2) + X_PIXEL, f_second, X_PIXEL, next[1]);  // after the border column
    };
    // An item that starts a run or an image quad also needs its first two x rows (grid rows r, r + 1).
    auto stage_first_rows = [&](int item) {
        if (item != first && item % S != 0) return;
        const int img0 = item / S * IMAGES, r = item % S;
        for (int e = tid; e < 2 * X_ROW_TASKS; e += WGRAD_THREADS) {
            const int p = r + e / X_ROW_TASKS;
            float2 v[IMAGES];
            load(x_row(item, p), e % X_ROW_TASKS, C - c0, C * SS, p >= 1, img0, v);
            store(x_slot(item, p) + X_PIXEL, e % X_ROW_TASKS, X_PIXEL, v);
        }
    };

    // per part of x: acc[part][16 tc + 4 octet + r] = D(row 16 warp + g + 8 (r / 2), channel 8 octet + 2t + r % 2)
    // of tap tc of this kernel row (wgmma's column 8j + 2t + r % 2 at d[4j + r], j = 4 tc + octet)
    float acc[2][48] = {};
    if (first < last) {
        fetch(first);
        __syncthreads();  // the zeros are written before any stash
        stage_first_rows(first);
        stash(first);
        if (first + 1 < last) fetch(first + 1);
    }
    for (int item = first; item < last; item++) {
        fence_proxy_async();
        __syncthreads();  // this item is staged; everyone is done with the slots the next one overwrites
        const float* x_s = x_slot(item, item % S + tap_row);  // this warpgroup's kernel row
        const float* dy_s = dy_slots + (item - first) % 2 * DY_ROW;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        // Descriptors as offsets (units of 16 bytes; a part's core matrices 256 bytes apart) from the big
        // parts of pixel 2j of dy and x; the small parts are the next core matrix.
        const unsigned long long dy_desc = wgmma_descriptor(dy_s, DY_PIXEL * 4, 256);
        const unsigned long long x_desc = wgmma_descriptor(x_s, X_PIXEL * 4, 256);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < PAIRS; j++) {  // k-step j: pixels 2j and 2j + 1 of the 4 images
            const unsigned long long dy_big = dy_desc + 2 * j * DY_PIXEL / 4, x_big = x_desc + 2 * j * X_PIXEL / 4;
            if constexpr (PR == Precision::Bf16) {
                wgmma_bf16<96>(acc[0], dy_big, x_big);
            } else {
                wgmma_tf32<96>(acc[0], dy_big, x_big);
                if (SPLIT) {
                    wgmma_tf32<96>(acc[1], dy_big, x_big + 8);
                    wgmma_tf32<96>(acc[1], dy_big + 8, x_big);
                }
            }
        }
        wgmma_commit();
        if (item + 1 < last) {  // staged while the tensor cores work
            stage_first_rows(item + 1);
            stash(item + 1);
            if (item + 2 < last) fetch(item + 2);
        }
        wgmma_wait_all();
#else
        const int lane = tid % 32;
#pragma unroll
        for (int j = 0; j < PAIRS; j++) {
            // A: ldmatrix tiles (rows 0-7, pixel 2j), (rows 8-15, 2j), (rows 0-7, 2j + 1), (rows 8-15, 2j + 1)
            // of the warp's 16 rows (octets 2 warp and 2 warp + 1) are mma's a[0..3]; a 16-byte row of a
            // tile is a pixel of IMAGES images (k8 of TF32, or k16 of bf16, over the two pixels).
            unsigned a[2][4];
#pragma unroll
            for (int part = 0; part < (SPLIT ? 2 : 1); part++)
                ldmatrix_x4(a[part], dy_s + (2 * j + lane / 16) * DY_PIXEL + (2 * warp + lane / 8 % 2) * 64 +
                                         part * 32 + lane % 8 * 4);
#pragma unroll
            for (int tc = 0; tc < 3; tc++) {
                if constexpr (PR == Precision::Bf16) {
#pragma unroll
                    for (int o = 0; o < 4; o += 2) {
                        // B: tiles (pixel 2j + tc, octet o), (2j + 1 + tc, o), (2j + tc, o + 1), (2j + 1 + tc,
                        // o + 1), big parts only: b[0..1] of octet o's 8 columns, b[2..3] of octet o + 1's
                        unsigned b[4];
                        ldmatrix_x4(
                            b, x_s + (2 * j + tc + lane / 8 % 2) * X_PIXEL + (16 * (o + lane / 16) + lane % 8) * 4);
                        mma_bf16(acc[0] + 16 * tc + 4 * o, a[0], b);
                        mma_bf16(acc[0] + 16 * tc + 4 * o + 4, a[0], b + 2);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i += 2) {
                        // B: tiles (pixel 2j + tc, columns 8i..), (2j + 1 + tc, 8i..), (2j + tc, 8i + 8..),
                        // (2j + 1 + tc, 8i + 8..): b[0..1] of columns 8i.. (octet i / 2's big parts) and
                        // b[2..3] of 8i + 8.. (its small parts)
                        unsigned b[4];
                        ldmatrix_x4(b,
                                    x_s + (2 * j + tc + lane / 8 % 2) * X_PIXEL + (8 * (i + lane / 16) + lane % 8) * 4);
                        float* big = acc[0] + 16 * tc + 2 * i;
                        float* small = acc[1] + 16 * tc + 2 * i;
                        mma_tf32(big, a[0], b);
                        if (SPLIT) {
                            mma_tf32(small, a[0], b + 2);
                            mma_tf32(small, a[1], b);  // dy small x x big
                        }
                    }
                }
            }
        }
        if (item + 1 < last) {
            stage_first_rows(item + 1);
            stash(item + 1);
            if (item + 2 < last) fetch(item + 2);
        }
#endif
    }

    // A channel's two sums (over x's big and small parts) are in the same thread; added, they go through
    // shared memory in dw's order [o][c][tap] (a row of 289 floats: the 8 rows of a store land in
    // different banks), then out coalesced.
    constexpr int ROW = WGRAD_CHANNELS * 9 + 1;
    static_assert(WGRAD_OUT * ROW <= WGRAD_X_SLOTS * X_ROW + 2 * DY_ROW, "the sums fit in the staging slots");
    __syncthreads();  // every warpgroup's products are done: the staging slots are free
#pragma unroll
    for (int tc = 0; tc < 3; tc++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                smem[(16 * warp + g + 8 * (r / 2)) * ROW + (8 * j + 2 * t + r % 2) * 9 + 3 * tap_row + tc] =
                    acc[0][16 * tc + 4 * j + r] + acc[1][16 * tc + 4 * j + r];
    __syncthreads();
    float* out = partial + (size_t)blockIdx.x * K * C * 9;
    for (int e = tid; e < WGRAD_OUT * WGRAD_CHANNELS * 9; e += WGRAD_THREADS) {
        const int o = e / (WGRAD_CHANNELS * 9), f = e % (WGRAD_CHANNELS * 9);
        if (o0 + o < K && c0 + f / 9 < C) out[((size_t)(o0 + o) * C + c0) * 9 + f] = smem[o * ROW + f];
    }
}

// Weight quads of one product in form F (c_in input, c_out output channels).
template <TileForm F, Precision PR>
__device__ __forceinline__ int product_quads(int c_in, int c_out) {
    return CEIL_DIV(c_out, tile_channels<F>) * CEIL_DIV(c_in, chunk_channels<PR>) * chunk_quads<F>;
}

// Quad q of one product's weights in form F, if q is one of them; else q less their number.
template <bool FLIPPED, Precision PR, TileForm F>
__device__ __forceinline__ bool stage_product_quad(const float* w, int Cin, int Cout, float4* quads, int& q) {
    const int count = product_quads<F, PR>(Cin, Cout);
    if (q < count) stage_weight_quad<FLIPPED, PR, F>(w, Cin, Cout, quads, q);
    q -= count;
    return q < 0;
}

// The weights of both products from w [K, C, 3, 3], one thread per float4: forward_quads (C in, K out)
// first, in the stacked form if forward_stacked (3xTF32 only: conv2_forward_stacked_fast reads them), then
// input_grad_quads (K in, C out; flipped), in the paired form if input_grad_paired (3xTF32 only:
// conv2_backward_input_paired_fast reads them).
template <Precision PR>
__device__ __forceinline__ void stage_weights(const float* w, int C, int K, float4* forward_quads,
                                              float4* input_grad_quads, int forward_stacked, int input_grad_paired) {
    int q = blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (PR == Precision::Fp32) {
        const bool forward_done = forward_stacked
                                      ? stage_product_quad<false, PR, TileForm::Stacked>(w, C, K, forward_quads, q)
                                      : stage_product_quad<false, PR, TileForm::Apart>(w, C, K, forward_quads, q);
        if (forward_done) return;
        if (input_grad_paired)
            stage_product_quad<true, PR, TileForm::Paired>(w, K, C, input_grad_quads, q);
        else
            stage_product_quad<true, PR, TileForm::Stacked>(w, K, C, input_grad_quads, q);
        return;
    }
    if (!stage_product_quad<false, PR, tile_form<PR, false>>(w, C, K, forward_quads, q))
        stage_product_quad<true, PR, tile_form<PR, true>>(w, K, C, input_grad_quads, q);
}

// Entry points: the precision (tensor_core.cuh) is a template parameter. Precision::Fp32 keeps float32's
// accuracy with the three products of 3xTF32; Precision::Tf32 rounds both operands to the nearest TF32 and
// multiplies once, as cuDNN's TF32 convolutions do: about 3e-4 relative error instead of 1e-6. The image
// tiles' A then holds a row per output channel (TileForm::OnePart): a third of the forward's tensor work,
// and for the input gradient half the blocks and half its tensor work; the weight gradient does a third of
// its tensor work. Precision::Bf16 rounds both operands to bf16 (about 3e-3 relative error) and multiplies
// once, 16 k per instruction: the TF32 form's layouts with 8 values in each 16 bytes, so a chunk is 16
// channels and a weight-gradient item 8 images, and each product needs half the instructions of plain TF32.

template <Precision P>
__global__ void conv2_stage_weights_fast(const float* w, int C, int K, float4* forward_quads, float4* input_grad_quads,
                                         int forward_stacked, int input_grad_paired) {
    stage_weights<P>(w, C, K, forward_quads, input_grad_quads, forward_stacked, input_grad_paired);
}

// Image-tile blocks per SM the kernels are compiled for: four (at most 128 registers), but three for the
// paired form, whose second set of 56 accumulators needs more than 128 (at most 168).
template <TileForm F>
constexpr int image_tile_blocks_per_sm = F == TileForm::Paired ? 3 : 4;

// grid (N, ceil(K / tile channels), CONV2_SIZE / CONV_ROWS), CONV_THREADS threads, dynamic shared memory
template <Precision P>
__global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<tile_form<P, false>>)
    conv2_forward_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K) {
    conv3x3_image_tile<P, tile_form<P, false>>(x, forward_quads, y, C, K);
}

// The 3xTF32 forward in the input gradient's stacked form, 32 output channels per block: twice the blocks
// of the form above, for small batches, where those leave SMs idle; weights staged with forward_stacked.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<TileForm::Stacked>)
    conv2_forward_stacked_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K) {
    conv3x3_image_tile<Precision::Fp32, TileForm::Stacked>(x, forward_quads, y, C, K);
}

// grid (N, ceil(C / tile channels), CONV2_SIZE / CONV_ROWS), as the forward
template <Precision P>
__global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<tile_form<P, true>>)
    conv2_backward_input_fast(const float* dy, const float4* input_grad_quads, float* dx, int N, int C, int K) {
    conv3x3_image_tile<P, tile_form<P, true>>(dy, input_grad_quads, dx, K, C);
}

// The 3xTF32 input gradient in the paired form, for large batches (five products per kernel row instead of
// six, three blocks per SM instead of four); weights staged with input_grad_paired.
extern "C" __global__ void __launch_bounds__(CONV_THREADS, image_tile_blocks_per_sm<TileForm::Paired>)
    conv2_backward_input_paired_fast(const float* dy, const float4* input_grad_quads, float* dx, int N, int C, int K) {
    conv3x3_image_tile<Precision::Fp32, TileForm::Paired>(dy, input_grad_quads, dx, K, C);
}

// grid (parts, ceil(K / WGRAD_OUT), ceil(C / WGRAD_CHANNELS)), WGRAD_THREADS threads, dynamic shared
// memory; partial [parts, K, C, 3, 3] (with one part: dw itself)
template <Precision P>
__global__ void __launch_bounds__(WGRAD_THREADS, 1)
    conv2_backward_weight_fast(const float* x, const float* dy, float* partial, int N, int C, int K,
                               int items_per_part) {
    conv3x3_weight_grad_rows<P>(x, dy, partial, N, C, K, items_per_part);
}
