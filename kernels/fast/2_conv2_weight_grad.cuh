// 2_conv2_weight_grad.cuh: conv2's weight gradient, conv3x3_weight_grad_rows, on the tensor cores in split parts:
// the fast form of conv2d_backward_weight_naive (naive/2_conv2d.cu). 6_splitk_reduce.cu adds the parts.
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
//
// FROM_LAYOUT: x and dy come in the weight gradient's layout (to_weight_grad_layout, at the end of this file), a
// pixel of a channel of 8 (bf16) or 4 images one 16-byte unit, so a staging load is whole units of 8 adjacent
// channels, 128 contiguous bytes, instead of each image's pixel pairs; the staged rows, products and sums are the
// same, and so are the bits.
//
// A block stages its items' rows (WeightGradStaging), multiplies each item (issue_item_products: wgmma on
// sm_90a, mma.sync elsewhere) while it stages the next, and writes its partial result (store_weight_grad).
#pragma once
#include "common.cuh"
// 2_conv2_tile_forms.cuh: CONV2_SIZE, and CONV_PADDED, the 16-wide grid of an image with its zero border
#include "2_conv2_tile_forms.cuh"
#include "tensor_core.cuh"

#if !defined(WGRAD_THREADS) || !defined(WGRAD_OUT) || !defined(WGRAD_CHANNELS) || !defined(WGRAD_IMAGES) || \
    !defined(WGRAD_X_SLOTS) || !defined(WGRAD_LAYOUT_THREADS) || !defined(WGRAD_LAYOUT_CHANNELS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
// Images per 16 staged bytes of k: WGRAD_IMAGES float32 values, twice as many in bf16.
template <Precision PR>
constexpr int wgrad_images = PR == Precision::Bf16 ? 2 * WGRAD_IMAGES : WGRAD_IMAGES;

// The staged rows, in floats. (An enum, not constexpr variables: NVRTC emits each namespace-scope variable
// that device code names into the module as a global, which nothing reads.)
enum WeightGradGeometry : int {
    // a staged pixel: [octet][part][8 channels][16 bytes of images]
    x_pixel_floats = 2 * WGRAD_CHANNELS * 4,
    dy_pixel_floats = 2 * WGRAD_OUT * 4,
    // a staged row: x's on the 16-wide grid (its border columns stay zero), dy's 14 pixels
    x_row_floats = CONV_PADDED * x_pixel_floats,
    dy_row_floats = CONV2_SIZE * dy_pixel_floats,
    // a row's staging tasks, 8 per channel (pixel pairs)
    x_row_tasks = WGRAD_CHANNELS * 8,
    dy_row_tasks = WGRAD_OUT * 8,
    // a row of the block's sums in shared memory, dw's [c][tap] and one more: the 8 rows of a store land in
    // different banks
    sums_row_floats = WGRAD_CHANNELS * 9 + 1,
};
static_assert(dy_row_tasks + x_row_tasks == 2 * WGRAD_THREADS && x_row_tasks == 2 * 128, "two tasks per thread");
static_assert(WGRAD_OUT * sums_row_floats <= WGRAD_X_SLOTS * x_row_floats + 2 * dy_row_floats,
              "the sums fit in the staging slots");

// What a thread fetches for a task: a pixel pair in each of the row's images, or the layout's two 16-byte units.
template <Precision PR, bool FROM_LAYOUT>
struct WeightGradFetchedOf {
    using type = float2[wgrad_images<PR>];
};
template <Precision PR>
struct WeightGradFetchedOf<PR, true> {
    using type = uint4[2];
};
template <Precision PR, bool FROM_LAYOUT>
using WeightGradFetched = typename WeightGradFetchedOf<PR, FROM_LAYOUT>::type;

// The block's staging of its items' rows into shared memory: x's rows in WGRAD_X_SLOTS slots, dy's in two.
// A staging task f of a row is 2 adjacent pixels (pair f / 8 % 8; pair 7 is past the row) of channel
// f / 64 * 8 + f % 8, in IMAGES images: 8 lanes take 8 adjacent channels of a pixel pair, so their 16-byte
// stores fill all 32 banks once, and 4 lane groups read 8 adjacent pixels of a channel.
// Per item, its dy row and the last of its three x rows (grid row r + 2) are two tasks per thread (a dy task,
// then a dy task in warpgroup 0 or an x task in the others), fetched into registers (next) two items ahead:
// while the tensor cores work on item i, item i + 1's registers (fetched during item i - 1) are stashed and
// item i + 2's loads are issued, so their latency passes behind a whole item. next belongs to
// conv3x3_weight_grad_rows, which the staging refers to: as a member of the struct the same code compiles to
// other instructions. In Bf16 x's and dy's rows are bf16: fetched as their bits (fetch_pair), stashed as they are.
// L2_PREFETCH: each load asks the L2 for the 256 bytes around it (fetch_pair). FROM_LAYOUT: x and dy in the
// weight gradient's layout, a task's loads two whole 16-byte units (next: WeightGradFetched).
template <Precision PR, bool L2_PREFETCH, bool FROM_LAYOUT>
struct WeightGradStaging {
    using Fetched = WeightGradFetched<PR, FROM_LAYOUT>;
    const conv2_stored<PR>* x;   // [N][C][14][14], bf16 in Bf16; FROM_LAYOUT: [groups][196][C][wgrad_images]
    const conv2_stored<PR>* dy;  // [N][K][14][14], bf16 in Bf16; FROM_LAYOUT: [groups][196][K][wgrad_images]
    float* smem;                 // x's slots, [slot][pixel][octet][part][8][4]
    float* dy_slots;             // dy's two slots, [slot][pixel][octet][part][8][4]
    int N, C, K, o0, c0;         // o0, c0: the block's first output and input channel
    int model_image;             // the first image of the block's model in x and dy ([models][N]; N per model)
    int first, tid;              // first: the block's first item
    int f_dy, f_second;          // this thread's two tasks of an item
    Fetched (&next)[2];

    // Grid row p (image row p - 1) of image quad q lives in x slot (16 q + p) % 6: an item (q, r) reads rows
    // r .. r + 2, and the next item's new rows (r + 3, or rows 0-2 of quad q + 1) are in other slots.
    __device__ __forceinline__ float* x_slot(int item, int p) const {
        return smem + (CONV_PADDED * (item / CONV2_SIZE) + p) % WGRAD_X_SLOTS * x_row_floats;
    }
    // Where the rows of an item start, at the block's first channel: image quad item / 14, and x's row (grid
    // row p, image row p - 1) or dy's row item % 14.
    // In the layout: where the row's pixel 0 starts, at the block's first channel (images past N are zeros there).
    __device__ __forceinline__ const conv2_stored<PR>* x_row(int item, int p) const {
        constexpr int S = CONV2_SIZE, SS = S * S, IMAGES = wgrad_images<PR>;
        if constexpr (FROM_LAYOUT)
            return x + (((size_t)model_group() + item / S) * SS + (p - 1) * S) * C * IMAGES + c0 * IMAGES;
        else
            return x + ((size_t)(model_image + item / S * IMAGES) * C + c0) * SS + (p - 1) * S;
    }
    __device__ __forceinline__ const conv2_stored<PR>* dy_row(int item) const {
        constexpr int S = CONV2_SIZE, SS = S * S, IMAGES = wgrad_images<PR>;
        if constexpr (FROM_LAYOUT)
            return dy + (((size_t)model_group() + item / S) * SS + item % S * S) * K * IMAGES + o0 * IMAGES;
        else
            return dy + ((size_t)(model_image + item / S * IMAGES) * K + o0) * SS + item % S * S;
    }
    // The model's first image group in the layout.
    __device__ __forceinline__ int model_group() const { return model_image / N * CEIL_DIV(N, wgrad_images<PR>); }

    // A pixel pair of a row: two float values, or a bf16 row's two values as they are, one 32-bit word in x (the
    // left pixel in its low half; y unused). With L2_PREFETCH the load asks the L2 for the 256 bytes around it
    // (.L2::256B): a warp's load takes 16- or 32-byte pieces of rows 28 or 56 bytes long, in 8 channels, and the
    // block's next items read the rows after them, which the L2 then already holds (docs/performance.md).
    __device__ __forceinline__ static float2 fetch_pair(const float* p) {
        if constexpr (!L2_PREFETCH) return load_pair(p);
        unsigned long long bits;  // the pair as one 8-byte load
        asm("ld.global.L2::256B.b64 %0, [%1];" : "=l"(bits) : "l"(p));
        return make_float2(__uint_as_float((unsigned)bits), __uint_as_float((unsigned)(bits >> 32)));
    }
    __device__ __forceinline__ static float2 fetch_pair(const bfloat16* p) {
        unsigned v;
        if constexpr (L2_PREFETCH)
            asm("ld.global.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
        else
            v = *reinterpret_cast<const unsigned*>(p);
        return make_float2(__uint_as_float(v), 0.0f);
    }
    // FROM_LAYOUT: task f of a row, its two pixels of its channel, as two 16-byte units `channels` units apart (the
    // tensor's channels); 8 lanes take 8 adjacent channels, 128 contiguous bytes. Pixels outside the image and
    // channels past the end are zeros (images past N are zeros in the layout).
    __device__ __forceinline__ void load(const conv2_stored<PR>* row, int f, int channels_left, int channels,
                                         bool row_inside, uint4* v) const {
        const int channel = f / 64 * 8 + f % 8, pair = f / 8 % 8;
        const bool inside = row_inside && pair < CONV2_SIZE / 2 && channel < channels_left;
        const uint4* src =
            reinterpret_cast<const uint4*>(row + ((size_t)2 * pair * channels + channel) * wgrad_images<PR>);
        const uint4 zero = make_uint4(0, 0, 0, 0);
        v[0] = inside ? src[0] : zero;
        v[1] = inside ? src[channels * wgrad_images<PR> * sizeof(conv2_stored<PR>) / 16] : zero;
    }
    // Task f of a row (float or bfloat16) into v by fetch_pair; pixels outside the image and channels or images
    // past the end are zeros.
    template <class V>
    __device__ __forceinline__ void load(const V* row, int f, int channels_left, int image_stride, bool row_inside,
                                         int img0, float2* v) const {
        constexpr int SS = CONV2_SIZE * CONV2_SIZE, PAIRS = CONV2_SIZE / 2, IMAGES = wgrad_images<PR>;
        const int channel = f / 64 * 8 + f % 8, pair = f / 8 % 8;
        const bool inside = row_inside && pair < PAIRS && channel < channels_left;
        const V* src = row + channel * SS + 2 * pair;
#pragma unroll
        for (int i = 0; i < IMAGES; i++)
            v[i] = inside && img0 + i < N ? fetch_pair(src + i * image_stride) : make_float2(0.0f, 0.0f);
    }
    // Whether the rows are bf16, fetched as their bits.
    static constexpr bool BITS = PR == Precision::Bf16;
    // FROM_LAYOUT: task f's two units into a staged row (pixels `pixel` floats apart), as they are in Bf16, split
    // into their parts (stage16) otherwise.
    __device__ __forceinline__ void store(float* row, int f, int pixel, const uint4* v) const {
        constexpr int PAIRS = CONV2_SIZE / 2;
        const int pair = f / 8 % 8;
        if (pair >= PAIRS) return;
        float* dst = row + 2 * pair * pixel + f / 64 * 64 + f % 8 * 4;
        if constexpr (BITS) {
            *reinterpret_cast<uint4*>(dst) = v[0];
            *reinterpret_cast<uint4*>(dst + pixel) = v[1];
        } else {
#pragma unroll
            for (int side = 0; side < 2; side++) {
                const float u[4] = {__uint_as_float(v[side].x), __uint_as_float(v[side].y), __uint_as_float(v[side].z),
                                    __uint_as_float(v[side].w)};
                stage16<PR>(u, reinterpret_cast<float4*>(dst + side * pixel),
                            reinterpret_cast<float4*>(dst + side * pixel + 32));
            }
        }
    }
    // v, task f's, into a staged row (pixels `pixel` floats apart), split into its parts: octet f / 64's big
    // parts, then its small parts. In Bf16 (BITS) v holds a bf16 row's bits (fetch_pair), whose 16-byte units of
    // 8 images are byte permutations of them.
    __device__ __forceinline__ void store(float* row, int f, int pixel, const float2* v) const {
        constexpr int PAIRS = CONV2_SIZE / 2, IMAGES = wgrad_images<PR>;
        const int pair = f / 8 % 8;
        if (pair >= PAIRS) return;
        float* dst = row + 2 * pair * pixel + f / 64 * 64 + f % 8 * 4;
        if constexpr (BITS) {
            static_assert(IMAGES == 8, "a bf16 unit is 8 images");
            unsigned left[4], right[4];  // images 2j (low half) and 2j + 1 of the left and the right pixel
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned a = __float_as_uint(v[2 * j].x), b = __float_as_uint(v[2 * j + 1].x);
                left[j] = __byte_perm(a, b, 0x5410);
                right[j] = __byte_perm(a, b, 0x7632);
            }
            *reinterpret_cast<uint4*>(dst) = make_uint4(left[0], left[1], left[2], left[3]);
            *reinterpret_cast<uint4*>(dst + pixel) = make_uint4(right[0], right[1], right[2], right[3]);
            return;
        }
        float left[IMAGES], right[IMAGES];
#pragma unroll
        for (int i = 0; i < IMAGES; i++) left[i] = v[i].x, right[i] = v[i].y;
        stage16<PR>(left, reinterpret_cast<float4*>(dst), reinterpret_cast<float4*>(dst + 32));
        stage16<PR>(right, reinterpret_cast<float4*>(dst + pixel), reinterpret_cast<float4*>(dst + pixel + 32));
    }

    // An item's dy row and the last of its x rows into next.
    __device__ __forceinline__ void fetch(int item) {
        constexpr int S = CONV2_SIZE, SS = S * S, IMAGES = wgrad_images<PR>;
        const int img0 = item / S * IMAGES, r = item % S;
        if constexpr (FROM_LAYOUT) {
            load(dy_row(item), f_dy, K - o0, K, true, next[0]);
            if (tid < 128)
                load(dy_row(item), f_second, K - o0, K, true, next[1]);
            else
                load(x_row(item, r + 2), f_second, C - c0, C, r + 1 < S, next[1]);
        } else {
            load(dy_row(item), f_dy, K - o0, K * SS, true, img0, next[0]);
            if (tid < 128)
                load(dy_row(item), f_second, K - o0, K * SS, true, img0, next[1]);
            else
                load(x_row(item, r + 2), f_second, C - c0, C * SS, r + 1 < S, img0, next[1]);
        }
    }
    // next into the item's slots.
    __device__ __forceinline__ void stash(int item) {
        float* dy_s = dy_slots + (item - first) % 2 * dy_row_floats;
        store(dy_s, f_dy, dy_pixel_floats, next[0]);
        if (tid < 128)
            store(dy_s, f_second, dy_pixel_floats, next[1]);
        else  // after the border column
            store(x_slot(item, item % CONV2_SIZE + 2) + x_pixel_floats, f_second, x_pixel_floats, next[1]);
    }
    // An item that starts a run or an image quad also needs its first two x rows (grid rows r, r + 1).
    __device__ __forceinline__ void stage_first_rows(int item) {
        constexpr int S = CONV2_SIZE, SS = S * S, IMAGES = wgrad_images<PR>;
        if (item != first && item % S != 0) return;
        const int img0 = item / S * IMAGES, r = item % S;
        for (int e = tid; e < 2 * x_row_tasks; e += WGRAD_THREADS) {
            const int p = r + e / x_row_tasks;
            Fetched v;
            if constexpr (FROM_LAYOUT)
                load(x_row(item, p), e % x_row_tasks, C - c0, C, p >= 1, v);
            else
                load(x_row(item, p), e % x_row_tasks, C - c0, C * SS, p >= 1, img0, v);
            store(x_slot(item, p) + x_pixel_floats, e % x_row_tasks, x_pixel_floats, v);
        }
    }
};

// A thread's sums, per part of x: acc[part][16 tc + 4 octet + r] = D(row 16 warp + g + 8 (r / 2), channel
// 8 octet + 2t + r % 2) of tap tc of its warpgroup's kernel row (wgmma's column 8j + 2t + r % 2 at d[4j + r],
// j = 4 tc + octet).
using WeightGradAccumulators = float[2][48];

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// An item's products from its staged rows, dy_s and x_s (this warpgroup's kernel row): per k-step, three
// wgmma m64n96k8 in 3xTF32, one in the others. They run asynchronously, so the block stages the next item
// before wait_item_products.
template <Precision PR>
__device__ __forceinline__ void issue_item_products(WeightGradAccumulators& acc, const float* dy_s, const float* x_s,
                                                    int tid, int warp) {
    constexpr bool SPLIT = PR == Precision::Fp32;  // two parts (3xTF32)
    // Descriptors as offsets (units of 16 bytes; a part's core matrices 256 bytes apart) from the big parts of
    // pixel 2j of dy and x; the small parts are the next core matrix.
    const unsigned long long dy_desc = wgmma_descriptor(dy_s, dy_pixel_floats * 4, 256);
    const unsigned long long x_desc = wgmma_descriptor(x_s, x_pixel_floats * 4, 256);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < CONV2_SIZE / 2; j++) {  // k-step j: pixels 2j and 2j + 1 of the 4 images
        const unsigned long long dy_big = dy_desc + 2 * j * dy_pixel_floats / 4,
                                 x_big = x_desc + 2 * j * x_pixel_floats / 4;
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
}
__device__ __forceinline__ void wait_item_products() { wgmma_wait_all(); }
#else
// An item's products as mma.sync, with the fragments loaded by ldmatrix from the same staged rows that
// wgmma reads. They are done when this returns.
template <Precision PR>
__device__ __forceinline__ void issue_item_products(WeightGradAccumulators& acc, const float* dy_s, const float* x_s,
                                                    int tid, int warp) {
    constexpr bool SPLIT = PR == Precision::Fp32;  // two parts (3xTF32)
    constexpr int X_PIXEL = x_pixel_floats, DY_PIXEL = dy_pixel_floats;
    const int lane = tid % 32;
#pragma unroll
    for (int j = 0; j < CONV2_SIZE / 2; j++) {
        // A: ldmatrix tiles (rows 0-7, pixel 2j), (rows 8-15, 2j), (rows 0-7, 2j + 1), (rows 8-15, 2j + 1)
        // of the warp's 16 rows (octets 2 warp and 2 warp + 1) are mma's a[0..3]; a 16-byte row of a
        // tile is a pixel of IMAGES images (k8 of TF32, or k16 of bf16, over the two pixels).
        unsigned a[2][4];
#pragma unroll
        for (int part = 0; part < (SPLIT ? 2 : 1); part++)
            ldmatrix_x4(a[part], dy_s + (2 * j + lane / 16) * DY_PIXEL + (2 * warp + lane / 8 % 2) * 64 + part * 32 +
                                     lane % 8 * 4);
#pragma unroll
        for (int tc = 0; tc < 3; tc++) {
            if constexpr (PR == Precision::Bf16) {
#pragma unroll
                for (int o = 0; o < 4; o += 2) {
                    // B: tiles (pixel 2j + tc, octet o), (2j + 1 + tc, o), (2j + tc, o + 1), (2j + 1 + tc,
                    // o + 1), big parts only: b[0..1] of octet o's 8 columns, b[2..3] of octet o + 1's
                    unsigned b[4];
                    ldmatrix_x4(b, x_s + (2 * j + tc + lane / 8 % 2) * X_PIXEL + (16 * (o + lane / 16) + lane % 8) * 4);
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
                    ldmatrix_x4(b, x_s + (2 * j + tc + lane / 8 % 2) * X_PIXEL + (8 * (i + lane / 16) + lane % 8) * 4);
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
}
__device__ __forceinline__ void wait_item_products() {}
#endif

// The block's partial result: a channel's two sums (over x's big and small parts) are in the same thread;
// added, they go through shared memory (smem, the staging slots, free once every product is done) in dw's
// order [o][c][tap], then out coalesced into part blockIdx.x of partial [parts][K][C][3][3].
__device__ __forceinline__ void store_weight_grad(const WeightGradAccumulators& acc, float* smem, float* partial, int C,
                                                  int K, int o0, int c0, int tid, int tap_row, int warp, int g, int t) {
    constexpr int ROW = sums_row_floats;
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

// One block: the sums of output channels o0 = blockIdx.y * WGRAD_OUT.. and input channels c0 = group *
// WGRAD_CHANNELS.. over items first = blockIdx.x * items_per_part .. last - 1, each warpgroup one kernel row.
// Several models: blockIdx.z = model * groups + group (groups = ceil(C / WGRAD_CHANNELS)); the model's x and dy
// are its batch of N images and its partial results are its parts ([model][gridDim.x][K][C][3][3]), so each
// model's parts hold what a launch for that model alone writes. L2_PREFETCH: as WeightGradStaging's (unused with
// FROM_LAYOUT). FROM_LAYOUT: x and dy in the weight gradient's layout, [models][groups][196][C or K][images].
template <Precision PR, bool L2_PREFETCH, bool FROM_LAYOUT>
__device__ __forceinline__ void conv3x3_weight_grad_rows(const conv2_stored<PR>* x, const conv2_stored<PR>* dy,
                                                         float* partial, int N, int C, int K, int items_per_part) {
    constexpr int IMAGES = wgrad_images<PR>, S = CONV2_SIZE, X_PIXEL = x_pixel_floats;
    extern __shared__ float4 conv_shared[];
    float* smem = reinterpret_cast<float*>(conv_shared);  // x: [slot][pixel][part][channel][4]; dy: [slot][pixel]...
    float* dy_slots = smem + WGRAD_X_SLOTS * x_row_floats;
    // The model's images are found by their index (staging.model_image), not by moving x and dy: with the pointers
    // moved, the bf16 form with wgmma ran about 5% slower (an H200, batches 512 and 2048); by index it runs as
    // the single-model kernel did.
    const int groups = CEIL_DIV(C, WGRAD_CHANNELS), model = model_index(groups);
    partial = model_part(partial, (size_t)gridDim.x * K * C * 9, model);
    const int o0 = blockIdx.y * WGRAD_OUT, c0 = model_z(groups) * WGRAD_CHANNELS, items = CEIL_DIV(N, IMAGES) * S;
    const int first = blockIdx.x * items_per_part, last = min(items, first + items_per_part);
    const int tid = threadIdx.x, tap_row = tid / 128, warp = tid / 32 % 4, g = tid % 32 / 4, t = tid % 4;

    for (int i = tid; i < WGRAD_X_SLOTS * 2 * X_PIXEL / 4; i += WGRAD_THREADS) {  // no stash writes the borders
        const int slot = i / (2 * X_PIXEL / 4), column = i / (X_PIXEL / 4) % 2 * (CONV_PADDED - 1);
        conv_shared[(slot * x_row_floats + column * X_PIXEL) / 4 + i % (X_PIXEL / 4)] =
            make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    using Staging = WeightGradStaging<PR, L2_PREFETCH, FROM_LAYOUT>;
    typename Staging::Fetched next[2];
    const int f_dy = tid, f_second = tid < 128 ? WGRAD_THREADS + tid : tid - 128;
    Staging staging{x, dy, smem, dy_slots, N, C, K, o0, c0, model * N, first, tid, f_dy, f_second, next};
    WeightGradAccumulators acc = {};
    if (first < last) {
        staging.fetch(first);
        __syncthreads();  // the zeros are written before any stash
        staging.stage_first_rows(first);
        staging.stash(first);
        if (first + 1 < last) staging.fetch(first + 1);
    }
    for (int item = first; item < last; item++) {
        fence_proxy_async();
        __syncthreads();  // this item is staged; everyone is done with the slots the next one overwrites
        const float* x_s = staging.x_slot(item, item % S + tap_row);  // this warpgroup's kernel row
        const float* dy_s = dy_slots + (item - first) % 2 * dy_row_floats;
        issue_item_products<PR>(acc, dy_s, x_s, tid, warp);
        if (item + 1 < last) {  // staged while the tensor cores work
            staging.stage_first_rows(item + 1);
            staging.stash(item + 1);
            if (item + 2 < last) staging.fetch(item + 2);
        }
        wait_item_products();
    }

    store_weight_grad(acc, smem, partial, C, K, o0, c0, tid, tap_row, warp, g, t);
}

// x or dy ([N][channels][14][14]) in the weight gradient's layout, [groups][196 pixels][channels][wgrad_images]
// (a group of wgrad_images<PR> images, those past N zeros): a pixel of a channel in a group is one 16-byte unit,
// as the weight gradient stages it, so its staging loads are whole units, 8 channels' 128 contiguous bytes per
// lane group, instead of each image's pixel pairs. A task is a group's 8 channels: their planes, contiguous in
// each image, are read as pixel pairs into shared memory, then each thread joins a pair's 8 (or 4) images into
// the two pixels' units. A block per task (a grid of fewer blocks, each taking several tasks, made the step slower:
// the kernels beside it lost the SMs it held). Several models: blockIdx.z, N and the groups per model.
template <Precision PR>
struct WeightGradLayout {
    static constexpr int I = wgrad_images<PR>, SS = CONV2_SIZE * CONV2_SIZE, PAIRS = SS / 2, CH = WGRAD_LAYOUT_CHANNELS;
    static_assert(CH == 8 && I * sizeof(conv2_stored<PR>) == 16, "8 lanes write 8 channels' units, 16 bytes each");
    // a plane's pairs, 4 more: in float32 the 8 channels' pairs that a half-warp reads fall in distinct banks; in
    // bf16 (4-byte pairs, 102 words a plane) two channels share a bank, as they would unpadded
    static constexpr int PLANE = PAIRS + 4;
    using Pair = typename Conv2Stored<PR>::pair;
    using Tile = Pair[I][CH][PLANE];
    const conv2_stored<PR>* src;
    conv2_stored<PR>* dst;
    int N, channels;

    // The task's planes as pixel pairs (zeros past the images and channels).
    __device__ __forceinline__ void load(Tile& tile, int g, int c0, int n_channels) const {
        for (int e = threadIdx.x; e < I * CH * PAIRS; e += WGRAD_LAYOUT_THREADS) {
            const int i = e / (CH * PAIRS), c = e / PAIRS % CH, pair = e % PAIRS, image = g * I + i;
            Pair v{};
            if (image < N && c < n_channels)
                v = *reinterpret_cast<const Pair*>(src + ((size_t)image * channels + c0 + c) * SS + 2 * pair);
            tile[i][c][pair] = v;
        }
    }
    // The task's units: a thread per pixel pair and channel, 8 lanes 8 adjacent channels (128 contiguous bytes).
    __device__ __forceinline__ void write(const Tile& tile, int g, int c0, int n_channels) const {
        for (int t = threadIdx.x; t < PAIRS * CH; t += WGRAD_LAYOUT_THREADS) {
            const int c = t % CH, pair = t / CH;
            if (c >= n_channels) continue;
            uint4 unit[2];  // the left and the right pixel
            if constexpr (PR == Precision::Bf16) {
                unsigned left[4], right[4];  // images 2j (low half) and 2j + 1
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const unsigned a = tile[2 * j][c][pair], b = tile[2 * j + 1][c][pair];
                    left[j] = __byte_perm(a, b, 0x5410);
                    right[j] = __byte_perm(a, b, 0x7632);
                }
                unit[0] = make_uint4(left[0], left[1], left[2], left[3]);
                unit[1] = make_uint4(right[0], right[1], right[2], right[3]);
            } else {
                float2 v[4];
#pragma unroll
                for (int i = 0; i < 4; i++) v[i] = tile[i][c][pair];
                unit[0] = make_uint4(__float_as_uint(v[0].x), __float_as_uint(v[1].x), __float_as_uint(v[2].x),
                                     __float_as_uint(v[3].x));
                unit[1] = make_uint4(__float_as_uint(v[0].y), __float_as_uint(v[1].y), __float_as_uint(v[2].y),
                                     __float_as_uint(v[3].y));
            }
            uint4* out = reinterpret_cast<uint4*>(dst + (((size_t)g * SS + 2 * pair) * channels + c0 + c) * I);
            out[0] = unit[0];
            out[channels * I * sizeof(conv2_stored<PR>) / 16] = unit[1];
        }
    }
};

template <Precision PR>
__device__ __forceinline__ void to_weight_grad_layout(const conv2_stored<PR>* src, conv2_stored<PR>* dst, int N,
                                                      int channels) {
    using Layout = WeightGradLayout<PR>;
    __shared__ typename Layout::Tile tile;
    const int groups = CEIL_DIV(N, Layout::I), octets = CEIL_DIV(channels, Layout::CH), model = model_index();
    const size_t image_values = (size_t)N * channels * Layout::SS;
    const Layout layout{model_part(src, image_values, model),
                        model_part(dst, (size_t)groups * Layout::SS * channels * Layout::I, model), N, channels};
    const int g = blockIdx.x / octets, c0 = blockIdx.x % octets * Layout::CH;
    const int n_channels = min(Layout::CH, channels - c0);
    layout.load(tile, g, c0, n_channels);
    __syncthreads();
    layout.write(tile, g, c0, n_channels);
}
