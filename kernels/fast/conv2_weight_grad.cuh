// conv2_weight_grad.cuh: conv2's weight gradient, conv3x3_weight_grad_rows, in split parts on the tensor cores:
// the fast form of conv2d_backward_weight_naive (naive/conv2d.cu).
#pragma once
#include "common.cuh"
#include "tensor_core.cuh"

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
