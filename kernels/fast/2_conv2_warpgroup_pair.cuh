// 2_conv2_warpgroup_pair.cuh: conv2's 3xTF32 forward for large batches as a persistent block of two warpgroups
// with every chunk's weights resident in shared memory (conv3x3_image_tiles_warpgroup_pair): a fast form of
// conv2d_forward_naive (naive/2_conv2d.cu) for large batches, which the step takes with producer warpgroups of its
// own staging the chunks (2_conv2_warp_specialized.cuh).
//
// A block per SM holds the weights of its 64 output channels for all the input channels (four chunks, 144 KB,
// staged once), and two warpgroups, each with two image buffers and an output region of its own: each takes every
// other of the block's tiles and runs their chunks as one stream (issue a chunk's products, stash the next chunk,
// fetch the one after it, wait for the products), storing each tile's output after its last chunk. Against a block
// per tile (conv3x3_image_tile) it leaves out the weights' refill between chunks (one buffer of them there) and
// lets one warpgroup store its output while the other multiplies; the second warpgroup starts once the first has
// done its first tile's products, so that their stores do not fall together. A chunk's image is fetched into
// registers a whole chunk before it is stashed: a warpgroup alone spends ~40% of its time waiting on those loads
// when it fetches them just before the stash (docs/performance.md). The sums are conv3x3_image_tile's, in the same
// order: the same bits, and with MOMENTS the same (mean, M2) per tile (store_tile_moments).
#pragma once
#include "2_conv2_image_tile.cuh"

// The named barrier of one warpgroup's CONV_THREADS threads (ids 1 and 2; 0 is __syncthreads'): the threads that
// share its image buffers and output region.
struct WarpgroupSync {
    int id;
    __device__ __forceinline__ void operator()() const {
        asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(CONV_THREADS) : "memory");
    }
};

// The pair's shared memory: the resident weights, [chunk][chunk_quads], then per warpgroup its two image buffers
// and its output region (32 rows of output_row_stride, store_image_tile's two halves).
enum WarpgroupPairGeometry : int {
    pair_warpgroup_floats = 2 * 4 * staged_plane_floats + 32 * output_row_stride,
};

// The second warpgroup's wait for the first's first tile of products (named barrier 3, both warpgroups' threads;
// the first arrives without waiting).
__device__ __forceinline__ void pair_start_barrier(int pair) {
    if (pair == 0)
        asm volatile("bar.arrive 3, %0;" ::"n"(2 * CONV_THREADS) : "memory");
    else
        asm volatile("bar.sync 3, %0;" ::"n"(2 * CONV_THREADS) : "memory");
}

// One block: output channels n0 = blockIdx.y * tile_channels.., and the tiles of the batch (tile t: image t / 2,
// image rows (t % 2) * CONV_ROWS..) 2 blockIdx.x + w, 2 blockIdx.x + w + 2 gridDim.x, .. for warpgroup w; a
// 2 * gridDim.x <= tiles grid gives every block's first warpgroup a tile. in [N][Cin][14][14], out [N][Cout][14][14],
// quads the weights staged for the apart form; with MOMENTS, each tile's (mean, M2) per channel in moment_parts
// [Cout, tiles, 2] as part t, as conv3x3_image_tile<.., MOMENTS> leaves them.
template <bool MOMENTS>
__device__ __forceinline__ void conv3x3_image_tiles_warpgroup_pair(const float* in, const float4* quads, float* out,
                                                                   int N, int Cin, int Cout, float* moment_parts) {
    constexpr Precision PR = Precision::Fp32;
    constexpr TileForm FORM = TileForm::Apart;
    constexpr int PLANE = staged_plane_floats, QUADS = chunk_quads<FORM>, CHUNK = chunk_channels<PR>;
    constexpr int SS = CONV2_SIZE * CONV2_SIZE, TILES_PER_IMAGE = CONV2_SIZE / CONV_ROWS;
    extern __shared__ float4 conv_shared[];
    const int chunks = CEIL_DIV(Cin, CHUNK), tiles = N * TILES_PER_IMAGE, n0 = blockIdx.y * tile_channels<FORM>;
    const int pair = threadIdx.x / CONV_THREADS, tid = threadIdx.x % CONV_THREADS;
    const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    float4* w_s = conv_shared;  // [chunks][QUADS]
    float* in_s = reinterpret_cast<float*>(w_s + chunks * QUADS) + pair * pair_warpgroup_floats;
    float* acc_s = in_s + 2 * 4 * PLANE;
    const WarpgroupSync sync{1 + pair};
    // the tiles are even in number (two per image), so both warpgroups have the same rounds of them
    const int stride = 2 * gridDim.x, rounds = CEIL_DIV(tiles - 2 * (int)blockIdx.x, stride);

    const float4* block_quads = quads + (size_t)blockIdx.y * chunks * QUADS;
    for (int e = threadIdx.x; e < chunks * QUADS; e += blockDim.x)
        cp_async16(reinterpret_cast<float*>(w_s + e), reinterpret_cast<const float*>(block_quads + e));
    for (int i = tid; i < 2 * PLANE; i += CONV_THREADS)  // both image buffers; the border stays zero
        reinterpret_cast<float4*>(in_s)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    TaskValues<PR, float> in_next[input_tasks_per_thread];
    const auto image = [&](int t) { return in + (size_t)(t / TILES_PER_IMAGE) * Cin * SS; };
    const auto first_row = [](int t) { return t % TILES_PER_IMAGE * CONV_ROWS; };
    const int first = 2 * blockIdx.x + pair;
    const int stages = max(0, rounds) * chunks;  // the warpgroup's chunks, all its tiles'
    using Staging = ImageTileStaging<PR, FORM, float>;
    Staging staging{image(first), block_quads, in_s, w_s, Cin, first_row(first), tid, in_next};
    const auto fetch = [&](int s) {  // stage s's chunk of its tile into in_next
        const int t = first + s / chunks * stride;
        staging.x = image(t);
        staging.r0 = first_row(t);
        staging.fetch_image(s % chunks);
    };
    if (stages > 0) fetch(0);
    cp_async_wait_all();
    __syncthreads();  // the weights are staged and the zeros written before any stash
    if (stages > 0) staging.stash(0);
    if (stages > 1) fetch(1);
    TileAccumulators<FORM> acc = {};
    for (int round = 0, stage = 0, tile = first; round < rounds; round++, tile += stride) {
        const int img = tile / TILES_PER_IMAGE, r0 = first_row(tile);
        if (pair == 1 && round == 0) pair_start_barrier(pair);
        for (int chunk = 0; chunk < chunks; chunk++, stage++) {
            const int buffer = stage % 2;
            fence_proxy_async();
            sync();  // this chunk is staged; the warpgroup is done with the other buffer
            issue_chunk_products<PR, FORM>(acc, in_s, w_s + chunk * QUADS, 0, buffer, tid, warp);
            if (stage + 1 < stages) {
                staging.stash(1 - buffer);  // fetched a chunk ago
                if (stage + 2 < stages) fetch(stage + 2);
            }
            wait_chunk_products();
        }
        if (pair == 0 && round == 0) pair_start_barrier(pair);
        if constexpr (MOMENTS) store_tile_moments(acc, moment_parts, n0, Cout, warp, g, t, tile, tiles);
        NoMoments none;
        store_image_tile<FORM, 2>(acc, acc_s, out, Cout, img, n0, r0, tid, warp, g, t, none, sync);
#pragma unroll
        for (int e = 0; e < tile_columns / 2; e++) acc[0][e] = 0.0f;
    }
}
