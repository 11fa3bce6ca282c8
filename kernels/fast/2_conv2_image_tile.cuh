// 2_conv2_image_tile.cuh: conv2's forward and input gradient, conv3x3_image_tile: one block per tile of an image,
// a matrix product on the tensor cores with the image staged in shared memory (2_conv2_tile_forms.cuh says how).
// The fast form of conv2d_forward_naive and conv2d_backward_input_naive (naive/2_conv2d.cu).
//
// A block stages its input a chunk of channels at a time (ImageTileStaging), multiplies each chunk
// (issue_chunk_products: wgmma on sm_90a, mma.sync elsewhere) while it stages the next, and writes its
// output channels out through shared memory (merge_paired_set in the paired form, store_image_tile). A block
// takes one tile (conv3x3_image_tile), or, in the forward's persistent form, a run of tiles whose chunks it
// stages and multiplies as one stream (conv3x3_image_tiles_persistent), which in training also sums its output's
// moments as it stores it (BlockMoments): the part of naive/3_batchnorm.cu's batchnorm_stats_naive that reads the
// output, so BN2's statistics need no pass of their own over it. The 3xTF32 forward, a block per tile, takes the
// same sums from its accumulators (store_tile_moments).
#pragma once
#include "common.cuh"
#include "2_conv2_tile_forms.cuh"
#include "part_reduce.cuh"

// The image tile's geometry. (An enum, not constexpr variables: NVRTC emits each namespace-scope variable
// that device code names into the module as a global, which nothing reads.)
enum ImageTileGeometry : int {
    // The block's tile: CONV_ROWS rows of the 16-wide grid are the product's columns (columns 14 and 15 of
    // each grid row are computed and dropped).
    tile_columns = CONV_ROWS * CONV_PADDED,
    staged_plane_floats = staged_pixels * 4,  // one plane: a (part, channel quad)'s pixels
    // A chunk of the input, per channel quad: the block's image rows and the rows above and below them,
    // which its taps read; a task is one (channel quad, pixel).
    input_pixels = (CONV_ROWS + 2) * CONV2_SIZE,
    input_tasks = 2 * input_pixels,
    input_tasks_per_thread = CEIL_DIV(input_tasks, CONV_THREADS),
    // Floats per row of the output tile in shared memory: the 4 rows of a half-warp's float2 stores then
    // start 8 banks apart (120 = -8 mod 32), so they have no bank conflicts.
    output_row_stride = tile_columns + 8,
};

// One staging task's values in registers, from an image of In (float or bfloat16): fetch reads channels c0 ..
// c0 + VALUES - 1 of a pixel (src: its channel 0; zeros outside the image and past Cin), stash writes them as the
// products read them (stage16). From a float image that rounds or splits them; a bf16 image's values, already
// rounded, go to shared memory as they are, two to a 32-bit word: half the registers, no conversion.
template <Precision PR, class In>
struct TaskValues {
    float v[staged_values<PR>];
    __device__ __forceinline__ void fetch(const In* src, bool inside, int c0, int Cin) {
        constexpr int SS = CONV2_SIZE * CONV2_SIZE;
#pragma unroll
        for (int i = 0; i < staged_values<PR>; i++)
            v[i] = inside && c0 + i < Cin ? load_value(src + (c0 + i) * SS) : 0.0f;
    }
    __device__ __forceinline__ void stash(float4* big, float4* small) const { stage16<PR>(v, big, small); }
};
template <>
struct TaskValues<Precision::Bf16, bfloat16> {
    unsigned pairs[4];  // channels c0 + 2j (the low half) and c0 + 2j + 1
    __device__ __forceinline__ void fetch(const bfloat16* src, bool inside, int c0, int Cin) {
        constexpr int SS = CONV2_SIZE * CONV2_SIZE;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned lo = inside && c0 + 2 * j < Cin ? src[(c0 + 2 * j) * SS].bits : 0u;
            const unsigned hi = inside && c0 + 2 * j + 1 < Cin ? src[(c0 + 2 * j + 1) * SS].bits : 0u;
            pairs[j] = lo | hi << 16;
        }
    }
    __device__ __forceinline__ void stash(float4* big, float4*) const {
        *reinterpret_cast<uint4*>(big) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
};

// The block's staging of its input, a chunk of input channels at a time: the image through registers
// (fetch_image, then stash, which splits it into its parts), the weights by cp.async (fetch_weights).
// in_next, the registers, belongs to conv3x3_image_tile (or conv3x3_image_tiles_persistent, which moves x and r0
// on to each next tile), which the staging refers to: as a member of the struct the same code compiles to other
// instructions. In: the image's type (float, or bfloat16: the forward's x and the input gradient's dy in Bf16).
template <Precision PR, TileForm FORM, class In>
struct ImageTileStaging {
    const In* x;                // the image of the tile being staged, [Cin][14][14]
    const float4* block_quads;  // the weights of the block's output channels, per chunk
    float* in_s;                // the image's two buffers, planes [part][channel quad][pixel][4] each
    float4* w_s;                // the weights' buffers (weight_buffers<FORM>)
    int Cin, r0, tid;           // r0: that tile's first image row
    // in_next[r]: task e = tid + r * CONV_THREADS = quad * input_pixels + p, channels VALUES * quad ..
    // + VALUES - 1 of the chunk at pixel p of the block's input rows (image rows r0 - 1 .. r0 + CONV_ROWS)
    TaskValues<PR, In> (&in_next)[input_tasks_per_thread];

    // The chunk's image into in_next; rows outside the image and channels past Cin are zeros.
    __device__ __forceinline__ void fetch_image(int chunk) {
        constexpr int S = CONV2_SIZE, VALUES = staged_values<PR>, CHUNK = chunk_channels<PR>;
#pragma unroll
        for (int r = 0; r < input_tasks_per_thread; r++) {
            const int e = tid + r * CONV_THREADS, p = e % input_pixels, row = r0 - 1 + p / S;
            const bool inside = e < input_tasks && row >= 0 && row < S;
            in_next[r].fetch(x + row * S + p % S, inside, chunk * CHUNK + VALUES * (e / input_pixels), Cin);
        }
    }

    // The chunk's weights, as conv2_stage_weights_fast laid them out, straight into their buffer (chunk % the
    // buffers; the persistent tiles name it).
    __device__ __forceinline__ void fetch_weights(int chunk) { fetch_weights(chunk, chunk % weight_buffers<FORM>); }
    __device__ __forceinline__ void fetch_weights(int chunk, int weight_buffer) {
        constexpr int QUADS = chunk_quads<FORM>;
        float4* dst = w_s + weight_buffer * QUADS;
        for (int e = tid; e < QUADS; e += CONV_THREADS)
            cp_async16(reinterpret_cast<float*>(dst + e),
                       reinterpret_cast<const float*>(block_quads + chunk * QUADS + e));
    }

    // in_next into the image's buffer `buffer`, split into its parts, inside the zero border.
    __device__ __forceinline__ void stash(int buffer) {
        constexpr int S = CONV2_SIZE, P = CONV_PADDED, PLANE = staged_plane_floats;
        float* planes = in_s + buffer * 4 * PLANE;
#pragma unroll
        for (int r = 0; r < input_tasks_per_thread; r++) {
            const int e = tid + r * CONV_THREADS, p = e % input_pixels, quad = e / input_pixels;
            if (e < input_tasks) {
                const int pixel = (p / S) * P + p % S + 1;
                in_next[r].stash(reinterpret_cast<float4*>(planes + quad * PLANE + pixel * 4),
                                 reinterpret_cast<float4*>(planes + (2 + quad) * PLANE + pixel * 4));
            }
        }
    }

    // While the tensor cores work on chunk `chunk` (in buffer `buffer`): the next chunk's image, and its
    // weights where they have a buffer of their own. (chunk by reference: the loop's own variable, as the
    // block's code is tuned with; a copy compiles to other instructions.)
    __device__ __forceinline__ void stage_next(const int& chunk, int chunks, int buffer) {
        if (chunk + 1 < chunks) {
            fetch_image(chunk + 1);
            if (weight_buffers<FORM> == 2) fetch_weights(chunk + 1);
            stash(1 - buffer);
        }
    }
};

// The accumulators of a thread: acc[set][4j + r] = D(row 16 * warp + g + 8 * (r / 2), column 8j + 2t + r % 2).
template <TileForm FORM>
using TileAccumulators = float[accumulator_sets<FORM>][tile_columns / 2];

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A chunk's products (the chunk in buffer `buffer` of the image and its weights in buffer chunk % weight_buffers:
// the persistent tiles pass that buffer as the chunk), each one warpgroup
// MMA of 64 rows x all tile_columns columns x 8 k, both operands read by the tensor cores from shared memory:
// a chunk is 9, 15, 18 or 27 instructions with nothing between them. They run asynchronously, so the block
// stages the next chunk before wait_chunk_products.
template <Precision PR, TileForm FORM>
__device__ __forceinline__ void issue_chunk_products(TileAccumulators<FORM>& acc, const float* in_s, const float4* w_s,
                                                     int chunk, int buffer, int tid, int warp) {
    constexpr int N = tile_columns, PLANE = staged_plane_floats, GROUP_ROWS = group_rows<FORM>;
    const float* b_planes = in_s + buffer * 4 * PLANE;
    const float4* a_chunk = w_s + chunk % weight_buffers<FORM> * chunk_quads<FORM>;
    wgmma_fence();
#pragma unroll
    for (int grp = 0; grp < 9 / group_taps<FORM>; grp++) {  // A at a_chunk[grp * 2 * GROUP_ROWS]
#pragma unroll
        for (int i = 0; i < group_products<FORM>; i++) {
            const unsigned long long a =
                wgmma_descriptor(a_chunk + grp * 2 * GROUP_ROWS + group_product<FORM>(i).a_row, GROUP_ROWS * 16, 128);
            const unsigned long long b = wgmma_descriptor(
                b_planes + 2 * product_b_part<FORM>(i) * PLANE + product_shift<FORM>(grp, i) * 4, PLANE * 4, 128);
            if constexpr (PR == Precision::Bf16)
                wgmma_bf16<N>(acc[group_product<FORM>(i).set], a, b);
            else
                wgmma_tf32<N>(acc[group_product<FORM>(i).set], a, b);
        }
    }
    wgmma_commit();
}
__device__ __forceinline__ void wait_chunk_products() { wgmma_wait_all(); }
#else
// A chunk's products as mma.sync: this warp's 16 rows x all tile_columns columns, one mma per 8 columns, the
// products of B's big part first, with the fragments loaded by ldmatrix from the same shared memory that
// wgmma reads. They are done when this returns.
template <Precision PR, TileForm FORM>
__device__ __forceinline__ void issue_chunk_products(TileAccumulators<FORM>& acc, const float* in_s, const float4* w_s,
                                                     int chunk, int buffer, int tid, int warp) {
    constexpr int N = tile_columns, PLANE = staged_plane_floats, GROUP_ROWS = group_rows<FORM>;
    constexpr int PRODUCTS = group_products<FORM>;
    const float* b_planes = in_s + buffer * 4 * PLANE;
    const float4* a_chunk = w_s + chunk % weight_buffers<FORM> * chunk_quads<FORM>;
    const int lane = tid % 32;
#pragma unroll
    for (int grp = 0; grp < 9 / group_taps<FORM>; grp++) {
        // ldmatrix tile m = lane / 8, row lane % 8. A: tiles (quad 0, rows 0-7), (quad 0, rows 8-15),
        // (quad 1, rows 0-7), (quad 1, rows 8-15) of the warp's 16 rows of product i are mma's a[i][0..3]
        unsigned a[PRODUCTS][4];
#pragma unroll
        for (int i = 0; i < PRODUCTS; i++)
            ldmatrix_x4(a[i],
                        reinterpret_cast<const float*>(a_chunk + grp * 2 * GROUP_ROWS) +
                            ((lane / 16) * GROUP_ROWS + group_product<FORM>(i).a_row + 16 * warp + lane % 16) * 4);
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
                    float* d = acc[group_product<FORM>(i).set];
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
}
__device__ __forceinline__ void wait_chunk_products() {}
#endif

// The paired form's second set into the first: its rows 0-31 as they are, its rows 32-63 (warps 2 and 3) one
// column to the left, where their output pixels are: column 8j + 2t + 1 takes column 8j + 2t + 2 from the next
// lane (t = 3: column 8j + 8 from lane t = 0).
__device__ __forceinline__ void merge_paired_set(float (&acc)[2][tile_columns / 2], int tid, int warp, int t) {
    constexpr int N = tile_columns;
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

// The barrier of the threads that share a tile's output region: the block's (a warpgroup's: WarpgroupSync,
// 2_conv2_warpgroup_pair.cuh).
struct BlockSync {
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// What store_image_tile takes where the moments of its output are not wanted.
struct NoMoments {
    static constexpr bool ON = false;
    __device__ __forceinline__ void begin_half(const float*, int, int, int) {}
    __device__ __forceinline__ void add(int, int, float2) {}
    __device__ __forceinline__ void end_half(int) {}
};

// One step of a warp's reduce-scatter: lanes whose bit 2 WIDTH is set keep the upper WIDTH of v[0 .. 2 WIDTH) (the
// others the lower), added to the same half of the lane 2 WIDTH apart, in v[0 .. WIDTH). A mask, not a branch,
// picks the half, so v stays in registers.
template <int WIDTH, int N>
__device__ __forceinline__ void halve_sums(float (&v)[N], int lane) {
    const unsigned upper = lane & (2 * WIDTH) ? ~0u : 0u;
#pragma unroll
    for (int i = 0; i < WIDTH; i++) {
        const unsigned lo = __float_as_uint(v[i]), hi = __float_as_uint(v[i + WIDTH]);
        const float keep = __uint_as_float((lo & ~upper) | (hi & upper));
        const float send = __uint_as_float((hi & ~upper) | (lo & upper));
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * WIDTH);
    }
}

// The sums a block of the persistent forward keeps of its output for BN2's statistics (store_block_moments, then
// batchnorm_stats_from_parts_fast), over every value it stores, as the output holds it (rounded to bf16 in Bf16).
// store_image_tile gives warp w a tile's channels w + 4j of each half (j < STEPS); each lane adds its pixels'
// deviations from the channel's shift and their squares (sums taken from a value near the mean keep
// M2 = Q - S^2 / n accurate in float32), a channel step's two sums in tile[j]. At the end of a half the warp's 32
// lanes reduce-scatter those 16 sums in 16 shuffles: lane l then holds sum (l >> 1) % 2 of step l >> 2 over the
// warp, added to total[half]. The shift is the channel's first output value in the block's first tile, before
// rounding (any value near the mean serves).
template <int STEPS>
struct BlockMoments {
    static constexpr bool ON = true;
    static constexpr int WARPS = CONV_THREADS / 32;
    static_assert(STEPS == 8, "16 sums per half, one for each pair of lanes");
    bool first_tile = true;
    float shift[2][STEPS];
    float tile[STEPS][2];
    float total[2] = {0.0f, 0.0f};

    __device__ __forceinline__ void begin_half(const float* acc_s, int half, int warp, int channels) {
        if (first_tile)
#pragma unroll
            for (int j = 0; j < STEPS; j++)  // pixel 0 of the warp's channels (read by every lane: a broadcast)
                shift[half][j] = warp + WARPS * j < channels ? acc_s[(warp + WARPS * j) * output_row_stride] : 0.0f;
#pragma unroll
        for (int j = 0; j < STEPS; j++) tile[j][0] = tile[j][1] = 0.0f;
    }
    __device__ __forceinline__ void add(int j, int half, float2 v) {
        const float d0 = v.x - shift[half][j], d1 = v.y - shift[half][j];
        tile[j][0] += d0 + d1;
        tile[j][1] = fmaf(d1, d1, fmaf(d0, d0, tile[j][1]));
    }
    __device__ __forceinline__ void end_half(int half) {
        const int lane = threadIdx.x % 32;
        float v[2 * STEPS];
#pragma unroll
        for (int i = 0; i < 2 * STEPS; i++) v[i] = tile[i / 2][i % 2];
        halve_sums<STEPS>(v, lane);  // 16 sums to 8 pairs of lanes, ...
        halve_sums<STEPS / 2>(v, lane);
        halve_sums<STEPS / 4>(v, lane);
        halve_sums<STEPS / 8>(v, lane);  // ... to 1: lane l's sum (l >> 1) over its pair of lanes
        total[half] += v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
    }
};

// The persistent forward's moments: BlockMoments with its statistics, NoMoments without.
template <bool MOMENTS>
struct TileMoments {
    using type = NoMoments;
};
template <>
struct TileMoments<true> {
    using type = BlockMoments<tile_channels<TileForm::OnePart> / 2 / (CONV_THREADS / 32)>;
};

// Block blockIdx.x's (mean, M2) of each of its channels n0.. (count values each) into partial [Cout, gridDim.x, 2]
// (part_pair's layout), from the moments' sums: lanes l % 4 == 0 hold a channel's S, lane l + 2 its Q.
template <int STEPS>
__device__ __forceinline__ void store_block_moments(const BlockMoments<STEPS>& m, float* partial, int n0, int Cout,
                                                    int warp, float count) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float q = __shfl_xor_sync(0xffffffffu, m.total[half], 2), s = m.total[half];
#pragma unroll
        for (int j = 0; j < STEPS; j++) {  // the lanes of step j: 4j .. 4j + 3
            const int c = n0 + 32 * half + warp + BlockMoments<STEPS>::WARPS * j;
            if (lane == 4 * j && c < Cout) {
                float* pair = part_pair(partial, c, gridDim.x, blockIdx.x);
                pair[0] = m.shift[half][j] + s / count;
                pair[1] = fmaxf(q - s * s / count, 0.0f);
            }
        }
    }
}

// The (mean, M2) of each channel n0.. of a block's one tile in the 3xTF32 forward's apart form, for BN2's statistics
// from a block per tile (batchnorm_stats_from_tiles_fast), into partial [Cout, tiles, 2] as part `tile`. Taken from
// the accumulators, whose values the form stores as they are (a row per channel): thread (g, t) of warp w holds
// columns 8j + 2t and 8j + 2t + 1 of rows 16w + g and 16w + g + 8, so a channel's sums are its four lanes', two
// shuffles (store_image_tile's layout would spread a channel over a warp). Columns 14 and 15 of each grid row
// (odd j, t = 3) are not pixels and are left out. The shift is the channel's pixel 0 (lane 4g's first value).
__device__ __forceinline__ void store_tile_moments(const TileAccumulators<TileForm::Apart>& acc, float* partial, int n0,
                                                   int Cout, int warp, int g, int t, int tile, int tiles) {
    constexpr float count = CONV_ROWS * CONV2_SIZE;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float shift = __shfl_sync(0xffffffffu, acc[0][2 * h], lane & ~3);
        float s = 0.0f, q = 0.0f;
#pragma unroll
        for (int j = 0; j < tile_columns / 8; j++) {
            if (j % 2 == 1 && t == 3) continue;  // grid columns 14 and 15
            const float d0 = acc[0][4 * j + 2 * h] - shift, d1 = acc[0][4 * j + 2 * h + 1] - shift;
            s += d0 + d1;
            q = fmaf(d1, d1, fmaf(d0, d0, q));
        }
#pragma unroll
        for (int width = 1; width < 4; width *= 2) {
            s += __shfl_xor_sync(0xffffffffu, s, width);
            q += __shfl_xor_sync(0xffffffffu, q, width);
        }
        const int c = n0 + 16 * warp + g + 8 * h;
        if (t == 0 && c < Cout) {
            float* pair = part_pair(partial, c, tiles, tile);
            pair[0] = shift + s / count;
            pair[1] = fmaxf(q - s * s / count, 0.0f);
        }
    }
}

// The block's output channels n0.. of image rows r0.. through shared memory (acc_s: the staging buffers, free
// once every product is done, or a region of its own), then out into out [img][Cout][14][14]: a warp per channel
// at a time, each lane two adjacent pixels of it (a 4- or 8-byte store), so a warp's store is a run of the
// channel's 98 consecutive pixels. The lane's pixels, and so their columns, are the same for every channel: the
// index arithmetic is done once, not per value. In the stacked and paired forms rows c and c + 32 both hold parts
// of channel c's sums and are added here; in the others row c is alone, and with HALVES = 2 the rows pass in two
// halves (warps 0-1, then 2-3), so acc_s needs room for 32 rows only. Out: float, or bfloat16 (the forward's y in
// Bf16). moments (BlockMoments, or NoMoments) sees each channel's stored values: unrolled over a warp's channel
// steps, so that its sums stay in registers. (Stores straight from the accumulators, 8 channels per store, measured
// slower in the forward at 512 and 4096: docs/performance.md.) sync: the barrier of the threads that share acc_s, the
// block's or, in the warpgroup pair (2_conv2_warpgroup_pair.cuh), a warpgroup's.
template <TileForm FORM, int HALVES, class Out, class Moments = NoMoments, class Sync = BlockSync>
__device__ __forceinline__ void store_image_tile(const TileAccumulators<FORM>& acc, float* acc_s, Out* out, int Cout,
                                                 int img, int n0, int r0, int tid, int warp, int g, int t,
                                                 Moments& moments, Sync sync = {}) {
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, ROWS = CONV_ROWS, N = tile_columns;
    constexpr int TILE = tile_channels<FORM>, STRIDE = output_row_stride, PAIRS = ROWS * S / 2;
    constexpr int WARPS = CONV_THREADS / 32, HALF_ROWS = 64 / HALVES;
    static_assert(HALVES == 1 || TILE == 64, "a channel's rows pass together");
#pragma unroll
    for (int half = 0; half < HALVES; half++) {
        sync();  // every product is done, and acc_s is free
        if (HALVES == 1 || warp / 2 == half) {
#pragma unroll
            for (int j = 0; j < N / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *reinterpret_cast<float2*>(
                        &acc_s[(16 * warp + g + 8 * h - half * HALF_ROWS) * STRIDE + 8 * j + 2 * t]) =
                        make_float2(acc[0][4 * j + 2 * h], acc[0][4 * j + 2 * h + 1]);
        }
        sync();
        Out* y = out + (size_t)img * Cout * SS + r0 * S;
        const int first = n0 + half * HALF_ROWS, channels = min(TILE / HALVES, Cout - first);
        moments.begin_half(acc_s, half, warp, channels);
#pragma unroll
        for (int k = 0; k < CEIL_DIV(PAIRS, 32); k++) {
            const int q = tid % 32 + 32 * k;  // the lane's pixels 2q, 2q + 1 of the block's rows
            if (q >= PAIRS) break;
            const float* d = acc_s + (q / (S / 2)) * P + 2 * (q % (S / 2));
            const auto store_channel = [&](int c) {  // channel first + c's two pixels; the values stored
                float2 v = *reinterpret_cast<const float2*>(d + c * STRIDE);
                if constexpr (TILE == 32) {
                    const float2 u = *reinterpret_cast<const float2*>(d + (c + 32) * STRIDE);
                    v = make_float2(v.x + u.x, v.y + u.y);
                }
                if constexpr (Moments::ON) return store_pair_stored(y + (first + c) * SS + 2 * q, v);
                store_pair(y + (first + c) * SS + 2 * q, v.x, v.y);
                return v;
            };
            if constexpr (Moments::ON) {  // the channel's step j names the sums' registers: unrolled
#pragma unroll
                for (int j = 0; j < CEIL_DIV(TILE / HALVES, WARPS); j++)
                    if (warp + WARPS * j < channels) moments.add(j, half, store_channel(warp + WARPS * j));
            } else {
                for (int c = warp; c < channels; c += WARPS) store_channel(c);
            }
        }
        moments.end_half(half);
    }
}

// One block: output channels n0 = blockIdx.y * tile_channels.. of image rows r0 = blockIdx.z * CONV_ROWS..
// of image blockIdx.x, from in [img][Cin][14][14] and the weights staged for FORM. The image passes through
// shared memory a chunk of input channels at a time, in two buffers: while the tensor cores multiply one
// chunk, the block fetches and stashes the next.
// Several models: the images are the models' batches one after another, images_per_model each, and quads holds
// the models' staged weights one after another; an image is multiplied by its model's weights, which is all
// that tells the models apart (nothing else depends on the batch). In, Out: float or bfloat16 (conv2_stored).
// With MOMENTS (one model, the apart form) the block also leaves its tile's (mean, M2) per channel in moment_parts
// [Cout, tiles, 2] (store_tile_moments) as part img * gridDim.z + blockIdx.z, the tiles numbered as the persistent
// form's.
template <Precision PR, TileForm FORM, class In, class Out, bool MOMENTS = false>
__device__ __forceinline__ void conv3x3_image_tile(const In* in, const float4* quads, Out* out, int Cin, int Cout,
                                                   int images_per_model, float* moment_parts = nullptr) {
    static_assert(tile_form_agrees<FORM>(), "the form's numbers agree");
    static_assert((FORM == TileForm::OnePart) == (PR != Precision::Fp32), "two parts exactly in 3xTF32");
    constexpr int VALUES = staged_values<PR>, CHUNK = chunk_channels<PR>;
    static_assert(64 * output_row_stride * 4 <= image_tile_bytes<FORM>, "the accumulators fit");
    constexpr int PLANE = staged_plane_floats, QUADS = chunk_quads<FORM>;
    extern __shared__ float4 conv_shared[];
    float* in_s = reinterpret_cast<float*>(conv_shared);  // [buffer][part][quad][pixel][4]
    float4* w_s = conv_shared + 2 * 4 * PLANE / 4;        // [weight_buffers][QUADS]
    const int img = blockIdx.x, n0 = blockIdx.y * tile_channels<FORM>, r0 = blockIdx.z * CONV_ROWS;
    const int chunks = CEIL_DIV(Cin, CHUNK), tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    const In* x = in + (size_t)img * Cin * (CONV2_SIZE * CONV2_SIZE);
    const float4* block_quads = model_part(quads, product_quads<FORM, PR>(Cin, Cout), model_of(img, images_per_model)) +
                                (size_t)blockIdx.y * chunks * QUADS;

    for (int i = tid; i < 2 * PLANE; i += CONV_THREADS)  // both buffers; the border stays zero
        conv_shared[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    TaskValues<PR, In> in_next[input_tasks_per_thread];
    ImageTileStaging<PR, FORM, In> staging{x, block_quads, in_s, w_s, Cin, r0, tid, in_next};
    TileAccumulators<FORM> acc = {};
    staging.fetch_image(0);
    staging.fetch_weights(0);
    __syncthreads();  // the zeros are written before any stash
    staging.stash(0);
    for (int chunk = 0; chunk < chunks; chunk++) {
        const int buffer = chunk % 2;
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();  // this chunk is staged; everyone is done with the other buffer
        issue_chunk_products<PR, FORM>(acc, in_s, w_s, chunk, buffer, tid, warp);
        staging.stage_next(chunk, chunks, buffer);
        wait_chunk_products();
        if (weight_buffers<FORM> == 1 && chunk + 1 < chunks) {
            __syncthreads();  // every warp's products are done with the weights' one buffer
            staging.fetch_weights(chunk + 1);
        }
    }

    if constexpr (FORM == TileForm::Paired) merge_paired_set(acc, tid, warp, t);
    if constexpr (MOMENTS) {
        static_assert(FORM == TileForm::Apart, "a row per channel, stored as computed");
        store_tile_moments(acc, moment_parts, n0, Cout, warp, g, t, img * gridDim.z + blockIdx.z,
                           gridDim.x * gridDim.z);
    }
    NoMoments none;
    store_image_tile<FORM, 1>(acc, in_s, out, Cout, img, n0, r0, tid, warp, g, t, none);
}

// The persistent image tiles (one model; forms with a row per output channel and two weight buffers): a block
// takes tiles t = blockIdx.x, blockIdx.x + gridDim.x, .. of the batch (tile t: image t / 2, image rows
// (t % 2) * CONV_ROWS..), output channels n0 = blockIdx.y * tile_channels.., and runs the chunks of all its
// tiles as one stream: while the tensor cores multiply a chunk, the block stages the next, the next tile's first
// chunk included. Only its first tile waits for its loads, where a block per tile waits for every tile's first
// chunk (in bf16 the largest of conv3x3_image_tile's stalls: docs/performance.md). The weights' buffers
// alternate with the stream; with at most two chunks they hold every chunk and are staged once. The output passes
// through a region of its own (acc_s, after the weights), 32 rows at a time, so the next tile's staging goes on beside
// it. The sums are conv3x3_image_tile's, in the same order: the same bits. With MOMENTS it also sums its output's
// moments as it stores it (BlockMoments) and leaves its (mean, M2) per channel in moment_parts (store_block_moments).
template <Precision PR, TileForm FORM, bool MOMENTS, class In, class Out>
__device__ __forceinline__ void conv3x3_image_tiles_persistent(const In* in, const float4* quads, Out* out, int N,
                                                               int Cin, int Cout, float* moment_parts) {
    static_assert(FORM == TileForm::OnePart && weight_buffers<FORM> == 2, "a row per channel, two weight buffers");
    constexpr int PLANE = staged_plane_floats, QUADS = chunk_quads<FORM>, CHUNK = chunk_channels<PR>;
    constexpr int SS = CONV2_SIZE * CONV2_SIZE, TILES_PER_IMAGE = CONV2_SIZE / CONV_ROWS;
    extern __shared__ float4 conv_shared[];
    float* in_s = reinterpret_cast<float*>(conv_shared);       // [buffer][part][quad][pixel][4]
    float4* w_s = conv_shared + 2 * 4 * PLANE / 4;             // [2][QUADS]
    float* acc_s = reinterpret_cast<float*>(w_s + 2 * QUADS);  // 32 rows of output_row_stride
    static_assert(32 * output_row_stride * 4 == CONV_PERSISTENT_OUTPUT_BYTES, "the ops module sizes the region");
    const int tiles = N * TILES_PER_IMAGE, chunks = CEIL_DIV(Cin, CHUNK), n0 = blockIdx.y * tile_channels<FORM>;
    const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    const bool resident = chunks <= 2;  // every chunk's weights in a buffer of their own, staged once
    if ((int)blockIdx.x >= tiles) return;

    for (int i = tid; i < 2 * PLANE; i += CONV_THREADS)  // both buffers; the border stays zero
        conv_shared[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    TaskValues<PR, In> in_next[input_tasks_per_thread];
    const float4* block_quads = quads + (size_t)blockIdx.y * chunks * QUADS;
    // tile t: image t / TILES_PER_IMAGE, its rows from first_row(t)
    const auto image = [&](int t) { return in + (size_t)(t / TILES_PER_IMAGE) * Cin * SS; };
    const auto first_row = [](int t) { return t % TILES_PER_IMAGE * CONV_ROWS; };
    int tile = blockIdx.x;
    ImageTileStaging<PR, FORM, In> staging{image(tile), block_quads, in_s, w_s, Cin, first_row(tile), tid, in_next};
    TileAccumulators<FORM> acc = {};
    typename TileMoments<MOMENTS>::type moments{};
    staging.fetch_image(0);
    staging.fetch_weights(0, 0);
    __syncthreads();  // the zeros are written before any stash
    staging.stash(0);
    for (int stage = 0; tile < tiles; tile += gridDim.x) {
        const int img = tile / TILES_PER_IMAGE, r0 = first_row(tile), next = tile + gridDim.x;
        for (int chunk = 0; chunk < chunks; chunk++, stage++) {
            const int buffer = stage % 2, weights = resident ? chunk : buffer;
            cp_async_wait_all();
            fence_proxy_async();
            __syncthreads();  // this chunk is staged; everyone is done with the other buffers
            issue_chunk_products<PR, FORM>(acc, in_s, w_s, weights, buffer, tid, warp);
            if (chunk + 1 < chunks) {
                staging.fetch_image(chunk + 1);
                if (!resident || tile == (int)blockIdx.x) staging.fetch_weights(chunk + 1, 1 - weights);
                staging.stash(1 - buffer);
            } else if (next < tiles) {  // the next tile's first chunk
                staging.x = image(next);
                staging.r0 = first_row(next);
                staging.fetch_image(0);
                if (!resident) staging.fetch_weights(0, 1 - buffer);
                staging.stash(1 - buffer);
            }
            wait_chunk_products();
        }
        store_image_tile<FORM, 2>(acc, acc_s, out, Cout, img, n0, r0, tid, warp, g, t, moments);
#pragma unroll
        for (int e = 0; e < tile_columns / 2; e++) acc[0][e] = 0.0f;
        if constexpr (MOMENTS) moments.first_tile = false;
    }
    if constexpr (MOMENTS) {
        const int block_tiles = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
        store_block_moments(moments, moment_parts, n0, Cout, warp, (float)(block_tiles * CONV_ROWS * CONV2_SIZE));
    }
}
