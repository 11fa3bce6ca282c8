// conv2_image_tile.cuh: conv2's forward and input gradient, conv3x3_image_tile, one image tile per block on
// the tensor cores: the fast form of conv2d_forward_naive and conv2d_backward_input_naive (naive/conv2d.cu).
#pragma once
#include "common.cuh"
#include "conv2_tile_forms.cuh"

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
