// 2_conv2_warp_specialized.cuh: conv2's 3xTF32 forward for large batches as the warpgroup pair
// (2_conv2_warpgroup_pair.cuh) with its staging given to warpgroups of its own (conv3x3_image_tiles_warp_specialized):
// the fast form of conv2d_forward_naive (naive/2_conv2d.cu) that the step takes in fp32 from PAIR_FORWARD_MIN_BATCH
// images on.
//
// A block per SM of four warpgroups: two consumers, each with the pair's tiles, image buffers and output region,
// which only issue their chunks' products and store their tiles' output, and two producers, one per consumer, which
// fetch each chunk of its image into registers and stash it into the consumer's next buffer. They hand the buffers
// to each other through mbarriers: `staged` (the producer's 128 threads have stashed the chunk) and `freed` (the
// consumer's products have read it). The producers keep few registers (release_registers) and the consumers take
// theirs (claim_registers). A consumer then never waits on its own loads, and its producer stages the next tile's
// first chunks while it stores its output. The chunks' image is split into its TF32 parts on the way into shared
// memory, which a tensor-memory copy (TMA) cannot do. The products are the pair's, in its order: the same bits, and
// with MOMENTS the same (mean, M2) per tile.
#pragma once
#include "2_conv2_warpgroup_pair.cuh"

// Registers per thread after the split: one producer and one consumer warpgroup share 2 x 128 x 256 of the SM's
// 64K 32-bit registers.
enum WarpSpecializedRegisters : int {
    producer_registers = 72,
    consumer_registers = 184,
};
static_assert(producer_registers + consumer_registers <= 256, "four warpgroups' registers fit the SM");

// The handing over of a consumer's two image buffers: staged[b] completes a phase when the producer has stashed a
// chunk into buffer b, freed[b] when the consumer's products have read it. Stage s (the s-th chunk of the
// warpgroup's tiles) is in buffer s % 2, the (s / 2)-th phase of that buffer's barriers.
struct ImageHandover {
    unsigned long long staged[2], freed[2];
};

// The producer of consumer `pair`: every chunk of the consumer's tiles (the same tiles as
// conv3x3_image_tiles_warpgroup_pair's warpgroup `pair`), each into the buffer its consumer has freed.
template <class Staging, class Fetch>
__device__ __forceinline__ void produce_image_chunks(Staging& staging, const Fetch& fetch, ImageHandover& handover,
                                                     int stages) {
    if (stages > 0) fetch(0);
    for (int s = 0; s < stages; s++) {
        const int buffer = s % 2;
        if (s >= 2) mbarrier_wait_parity(&handover.freed[buffer], (s / 2 - 1) & 1);
        staging.stash(buffer);
        fence_proxy_async();  // the stashed chunk is visible to the consumer's wgmma
        mbarrier_arrive(&handover.staged[buffer]);
        if (s + 1 < stages) fetch(s + 1);
    }
}

// One block: output channels n0 = blockIdx.y * tile_channels.., warpgroups 0 and 1 the consumers of tiles
// 2 blockIdx.x + w, 2 blockIdx.x + w + 2 gridDim.x, .. (w: the warpgroup), 2 and 3 their producers; launch and
// arguments as conv3x3_image_tiles_warpgroup_pair.
template <bool MOMENTS>
__device__ __forceinline__ void conv3x3_image_tiles_warp_specialized(const float* in, const float4* quads, float* out,
                                                                     int N, int Cin, int Cout, float* moment_parts) {
    constexpr Precision PR = Precision::Fp32;
    constexpr TileForm FORM = TileForm::Apart;
    constexpr int PLANE = staged_plane_floats, QUADS = chunk_quads<FORM>, CHUNK = chunk_channels<PR>;
    constexpr int SS = CONV2_SIZE * CONV2_SIZE, TILES_PER_IMAGE = CONV2_SIZE / CONV_ROWS;
    extern __shared__ float4 conv_shared[];
    __shared__ ImageHandover handovers[2];
    const int chunks = CEIL_DIV(Cin, CHUNK), tiles = N * TILES_PER_IMAGE, n0 = blockIdx.y * tile_channels<FORM>;
    const int warpgroup = threadIdx.x / CONV_THREADS, pair = warpgroup % 2, tid = threadIdx.x % CONV_THREADS;
    const bool producer = warpgroup >= 2;
    float4* w_s = conv_shared;  // [chunks][QUADS]
    float* in_s = reinterpret_cast<float*>(w_s + chunks * QUADS) + pair * pair_warpgroup_floats;
    ImageHandover& handover = handovers[pair];
    const int stride = 2 * gridDim.x, rounds = CEIL_DIV(tiles - 2 * (int)blockIdx.x, stride);
    const int first = 2 * blockIdx.x + pair, stages = max(0, rounds) * chunks;

    const float4* block_quads = quads + (size_t)blockIdx.y * chunks * QUADS;
    for (int e = threadIdx.x; e < chunks * QUADS; e += blockDim.x)
        cp_async16(reinterpret_cast<float*>(w_s + e), reinterpret_cast<const float*>(block_quads + e));
    if (producer)
        for (int i = tid; i < 2 * PLANE; i += CONV_THREADS)  // both image buffers; the border stays zero
            reinterpret_cast<float4*>(in_s)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    cp_async_wait_all();
    // each thread's copies of the weights are visible to every consumer's wgmma after the barrier below
    fence_proxy_async();
    if (producer && tid < 2) {  // set up once no copy is in flight (compute-sanitizer's racecheck counts them)
        mbarrier_init(&handover.staged[tid], CONV_THREADS);
        mbarrier_init(&handover.freed[tid], CONV_THREADS);
    }
    __syncthreads();  // the weights are staged, the zeros written and the mbarriers set up

    if (producer) {
        release_registers<producer_registers>();
        TaskValues<PR, float> in_next[input_tasks_per_thread];
        const auto image = [&](int t) { return in + (size_t)(t / TILES_PER_IMAGE) * Cin * SS; };
        ImageTileStaging<PR, FORM, float> staging{image(first), block_quads, in_s, w_s, Cin, 0, tid, in_next};
        const auto fetch = [&](int s) {  // stage s's chunk of its tile into in_next
            const int t = first + s / chunks * stride;
            staging.x = image(t);
            staging.r0 = t % TILES_PER_IMAGE * CONV_ROWS;
            staging.fetch_image(s % chunks);
        };
        produce_image_chunks(staging, fetch, handover, stages);
        return;
    }
    claim_registers<consumer_registers>();
    const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    float* acc_s = in_s + 2 * 4 * PLANE;
    const WarpgroupSync sync{1 + pair};
    TileAccumulators<FORM> acc = {};
    for (int round = 0, stage = 0, tile = first; round < rounds; round++, tile += stride) {
        if (pair == 1 && round == 0) pair_start_barrier(pair);
        for (int chunk = 0; chunk < chunks; chunk++, stage++) {
            const int buffer = stage % 2;
            mbarrier_wait_parity(&handover.staged[buffer], (stage / 2) & 1);
            issue_chunk_products<PR, FORM>(acc, in_s, w_s + chunk * QUADS, 0, buffer, tid, warp);
            wait_chunk_products();
            if (stage + 2 < stages) mbarrier_arrive(&handover.freed[buffer]);
        }
        if (pair == 0 && round == 0) pair_start_barrier(pair);
        if constexpr (MOMENTS) store_tile_moments(acc, moment_parts, n0, Cout, warp, g, t, tile, tiles);
        NoMoments none;
        store_image_tile<FORM, 2>(acc, acc_s, out, Cout, tile / TILES_PER_IMAGE, n0, tile % TILES_PER_IMAGE * CONV_ROWS,
                                  tid, warp, g, t, none, sync);
#pragma unroll
        for (int e = 0; e < tile_columns / 2; e++) acc[0][e] = 0.0f;
    }
}
