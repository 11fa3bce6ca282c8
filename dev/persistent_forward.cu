// persistent_forward.cu: a prototype, not part of the step. The training forward of one batch (load to loss,
// and the gradient at fc1's pre-activation, as FastNet.forward) as one persistent kernel, to measure whether a
// step that keeps its activations on chip pays at batch 64 (dev/persistent_forward.py; docs/performance.md).
//
// Grid: PF_BATCH images x 2 tiles of conv2's output channels x 2 halves of its rows = the image tiles of
// conv2's forward (conv3x3_image_tile), each block resident for the whole forward (the caller checks that every
// block fits at once). The stages, and the grid-wide waits the math needs between them:
//   1. conv1's BatchNorm statistics from the batch's image moments (every block, for itself); the block's
//      image staged. conv2's product then computes its input where it stages it: conv1 -> BN -> ReLU -> pool
//      for the chunk's channels and the block's rows (Conv1Pooled, below), while the tensor cores work on the
//      chunk before. conv1's pooled output never goes through memory on its way to conv2; the tile-0 blocks
//      store it (with the argmax) for the backward. (With PF_CONV1_FIRST, conv1's part is computed for all
//      channels into shared memory before the product instead.)
//   2. Each block's (mean, M2) of its 32 channels over its 98 outputs, straight from the accumulators.
//      -- grid wait --
//   3. BN2's statistics merged from the 2 x PF_BATCH parts (each block for its 16 channels), BN2 -> ReLU ->
//      pool of 16 channels of its image into fc1's input.
//      -- grid wait --
//   4. fc1 split over k: block b < 196 multiplies all samples' features 64 k at a time by 32 of fc1's rows.
//      -- grid wait --
//   5. Block s < PF_BATCH: sample s's fc1 sums in order, bias, ReLU, then fc2, log-softmax, NLL, its loss,
//      dlogits and the gradient at fc1's pre-activation (as the head kernel computes them).
// The default model only (conv1 32 channels, conv2 64, hidden 128), in float32's accuracy (3xTF32 for conv2;
// fc1 in FP32 multiply-adds). conv2's weights come staged (conv2_stage_weights_fast), as the step stages them at
// this batch: for conv2_forward_stacked_fast, 32 output channels per tile.
#include "../kernels/fast/conv1_bn_relu_pool.cu"
#include "../kernels/fast/conv2_implicit_gemm.cu"

#if !defined(PF_BATCH) || !defined(PF_CONV1_FIRST)
#error "compile through dev/persistent_forward.py"
#endif
#define PF_C1 32
#define PF_C2 64
#define PF_HIDDEN 128
#define PF_FEATURES (PF_C2 * 49)
#define PF_PARTS (2 * PF_BATCH)       // BN2's parts: one per (image, half)
#define PF_K_SLICE 64                 // fc1: features per item
#define PF_SLICES (PF_FEATURES / PF_K_SLICE)
#define PF_ROW_GROUP 32               // fc1: rows per item
#define PF_ITEMS (PF_SLICES * (PF_HIDDEN / PF_ROW_GROUP))
#define PF_IMAGE_REGS CEIL_DIV(P1 * P1, CONV_THREADS)  // the padded image's bytes per thread
static_assert(PF_FEATURES % PF_K_SLICE == 0 && CONV_THREADS == 128, "prototype geometry");
static_assert(PF_BATCH == 64, "an fc1 item per block, a sample per thread quad of fc1 (4 x 16), a head sample per block");

// conv3x3_image_tile_loaded is the step's conv3x3_image_tile given a loader of its input and its block's place
// (dev/persistent_forward.py copies it in after conv2's source). Its loaders fill channels c0 .. c0 + VALUES - 1
// of conv2's input pixel (row, col), zeros where inside is false.

// Output value (channel c of the tile, pixel p of the block's rows) of the image tile the block has just
// computed in 3xTF32: conv3x3_image_tile leaves its accumulators in shared memory, [64][CONV_ROWS * 16 + 8],
// the weights' big and small parts in rows c and c + 32, column (p / 14) * 16 + p % 14.
__device__ __forceinline__ float image_tile_output(int c, int p) {
    constexpr int S = CONV2_SIZE, P = CONV_PADDED, ACC_STRIDE = CONV_ROWS * P + 8;
    extern __shared__ float4 conv_shared[];
    const float* acc_s = reinterpret_cast<const float*>(conv_shared);
    const int column = (p / S) * P + p % S;
    return acc_s[c * ACC_STRIDE + column] + acc_s[(c + 32) * ACC_STRIDE + column];
}

// The grid-wide wait, as cooperative groups' grid.sync() does it: thread 0 of each block adds to one counter,
// block 0 adding 0x80000000 - (blocks - 1), so that the top bit flips when the last block arrives; each waits
// for the flip. The counter is never reset (the next wait flips the bit back). A wait that spins for about a
// second gives up and raises sync[1] (a block that never became resident), so a broken launch cannot hang.
__device__ __forceinline__ void grid_wait(unsigned* sync) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(sync, add);
        for (unsigned spins = 0;; spins++) {
            unsigned now;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(sync) : "memory");
            if ((old ^ now) & 0x80000000u) break;
            if (spins == (1u << 26)) {
                atomicAdd(sync + 1, 1u);
                break;
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// Where a block is, for dev/persistent_forward.py's breakdown: thread 0 stamps %globaltimer (ns) at the end of
// each stage into stamps [blocks][PF_STAMPS] (when stamps is not null).
#define PF_STAMPS 11
__device__ __forceinline__ void stamp(unsigned long long* stamps, int k) {
    if (stamps != nullptr && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        stamps[blockIdx.x * PF_STAMPS + k] = t;
    }
}

// conv2's input where conv3x3_image_tile stages it: pooled = maxpool(relu(bn1(conv1(image)))) of channels
// c0.. at (row, col), from the block's staged padded image, conv1's weights and BN1's statistics in shared
// memory. Blocks that own the row store it and its argmax (what conv1's backward reads).
struct Conv1Pooled {
    const float* image;  // padded P1 x P1, normalised
    const float4 (*w)[3];
    const float *mean, *invstd, *gamma, *beta;
    float* pooled;        // this image's [C1, 14, 14], or null where the block stores nothing
    unsigned char* argmax;
    int first_row, last_row;  // the rows this block stores

    template <int VALUES>
    __device__ __forceinline__ void operator()(int c0, int row, int col, bool inside, float (&v)[VALUES]) const {
        if (!inside) {
#pragma unroll
            for (int i = 0; i < VALUES; i++) v[i] = 0.0f;
            return;
        }
        float p[4][4];
        const int t = row * POOLED1 + col;
        load_patch(image, t, p);
        const bool store = pooled != nullptr && row >= first_row && row < last_row;
#pragma unroll
        for (int i = 0; i < VALUES; i++) {
            const int c = c0 + i;
            float a[4];
            conv1_window(p, w[c], a);
            const float m = mean[c], is = invstd[c], g = gamma[c], b = beta[c];
            int at;
            v[i] = relu_max4(batchnorm_apply(a[0], m, is, g, b), batchnorm_apply(a[1], m, is, g, b),
                             batchnorm_apply(a[2], m, is, g, b), batchnorm_apply(a[3], m, is, g, b), &at);
            if (store) {
                pooled[c * WINDOWS + t] = v[i];
                argmax[c * WINDOWS + t] = pool_position(v[i], at);
            }
        }
    }
};

// The same input read from shared memory where it was computed first: s [channel][row - first_row][col].
template <int ROWS_STAGED>
struct PooledInShared {
    const float (*s)[ROWS_STAGED][CONV2_SIZE];
    int first_row;

    template <int VALUES>
    __device__ __forceinline__ void operator()(int c0, int row, int col, bool inside, float (&v)[VALUES]) const {
#pragma unroll
        for (int i = 0; i < VALUES; i++) v[i] = inside ? s[c0 + i][row - first_row][col] : 0.0f;
    }
};

// grid 4 * PF_BATCH (block b: image b / 4, tile b / 2 % 2, half b % 2), CONV_THREADS threads, dynamic shared
// memory image_tile_shared_bytes("forward_stacked", "fp32"). sync: 2 words, zero before the first launch.
// bn2_partial [C2, PF_PARTS, 2]; fc1_partial [PF_SLICES, PF_BATCH, PF_HIDDEN]; sample_loss [PF_BATCH].
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2)
persistent_forward(const unsigned char* x, const int* labels, const double* moments, const float* w1,
                   const float* gamma1, const float* beta1, const float4* forward_quads, const float* gamma2,
                   const float* beta2, const float* fc1_w, const float* fc1_b, const float* fc2_w,
                   const float* fc2_b, float eps, float momentum, float* mean1, float* invstd1, float* running_mean1,
                   float* running_var1, float* mean2, float* invstd2, float* running_mean2, float* running_var2,
                   float* out1, unsigned char* argmax1, float* a2, float* bn2_partial, float* out2,
                   unsigned char* argmax2, float* fc1_partial, float* fc1_out, float* logits, float* d_pre,
                   float* sample_loss, unsigned* sync, unsigned long long* stamps) {
    stamp(stamps, 0);
    extern __shared__ float4 persistent_shared[];  // conv2's staging, then fc1's operands
    __shared__ __align__(16) float image[P1 * P1];
    __shared__ float pixel_value[256];
    __shared__ float4 w1_s[PF_C1][3];
    __shared__ float bn1[4][PF_C1];   // mean, invstd, gamma, beta
    __shared__ float bn2[2][16];      // mean, invstd of the block's 16 channels
    __shared__ double mom[CONV1_MOMENTS];
    __shared__ float head_s[PF_HIDDEN + 2 * NUM_CLASSES];
    const int b = blockIdx.x, img = b / 4, tile = b / 2 % 2, half = b % 2, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    constexpr int ROWS = CONV_ROWS, S2 = CONV2_SIZE;

    // ---- 1. BN1's statistics, the image, conv2 with conv1 computed as it is staged ----
    unsigned char bytes[PF_IMAGE_REGS];
#pragma unroll
    for (int r = 0; r < PF_IMAGE_REGS; r++) {
        int pixel;
        bytes[r] = padded_pixel(tid + r * CONV_THREADS, &pixel) ? x[img * S1 * S1 + pixel] : 0;
    }
    load_channel_weights<PF_C1>(w1, PF_C1, 0, w1_s);
    for (int v = tid; v < 256; v += CONV_THREADS) pixel_value[v] = normalize_pixel((unsigned char)v);
    if (tid < CONV1_MOMENTS) mom[tid] = moments[tid];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < PF_IMAGE_REGS; r++) {
        const int i = tid + r * CONV_THREADS;
        int pixel;
        if (i < P1 * P1) image[i] = padded_pixel(i, &pixel) ? pixel_value[bytes[r]] : 0.0f;
    }
    if (tid < PF_C1) {
        const double count = (double)PF_BATCH * S1 * S1;
        float m, var;
        channel_stats(mom, w1_s[tid], count, &m, &var);
        bn1[0][tid] = m;
        bn1[1][tid] = rsqrtf(var + eps);
        bn1[2][tid] = gamma1[tid];
        bn1[3][tid] = beta1[tid];
        if (b == 0) batchnorm_finalize(tid, m, var, (float)count, eps, momentum, mean1, invstd1, running_mean1,
                                       running_var1);
    }
    __syncthreads();
    stamp(stamps, 1);
    const Conv1Pooled conv1{image, w1_s, bn1[0], bn1[1], bn1[2], bn1[3],
                            tile == 0 ? out1 + (size_t)img * PF_C1 * WINDOWS : nullptr,
                            argmax1 + (size_t)img * PF_C1 * WINDOWS, half * ROWS, half * ROWS + ROWS};
#if PF_CONV1_FIRST
    // The other form: conv1's pooled output of the block's input rows (r0 - 1 .. r0 + 7 inside the image), every
    // channel, into shared memory before the product (thread t < 126: window (r0 - 1 + t / 14, t % 14)), which
    // the product's staging then reads.
    __shared__ float conv1_s[PF_C1][ROWS + 2][S2];
    {
        const int row = half * ROWS - 1 + tid / S2, col = tid % S2;
        if (tid < (ROWS + 2) * S2 && row >= 0 && row < S2) {
            float v[PF_C1];
            conv1(0, row, col, true, v);
#pragma unroll
            for (int c = 0; c < PF_C1; c++) conv1_s[c][tid / S2][col] = v[c];
        }
    }
    __syncthreads();
    stamp(stamps, 2);
    const PooledInShared<ROWS + 2> staged{conv1_s, half * ROWS - 1};
    conv3x3_image_tile_loaded<Precision::Fp32, TileForm::Stacked>(staged, forward_quads, a2, PF_C1, PF_C2, img, tile, half);
#else
    stamp(stamps, 2);
    conv3x3_image_tile_loaded<Precision::Fp32, TileForm::Stacked>(conv1, forward_quads, a2, PF_C1, PF_C2, img, tile, half);
#endif
    stamp(stamps, 3);

    // ---- 2. each channel's (mean, M2) over the block's outputs, from the accumulators ----
    constexpr int HW = ROWS * S2;  // 98
    for (int cl = warp; cl < CONV_TILE_CHANNELS_STACKED; cl += CONV_THREADS / 32) {
        float v[4], sum = 0.0f, sq = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int p = lane + 32 * i;
            v[i] = p < HW ? image_tile_output(cl, p) : 0.0f;
            sum += v[i];
        }
        const float mean = warp_sum(sum) / HW;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float d = lane + 32 * i < HW ? v[i] - mean : 0.0f;
            sq += d * d;
        }
        const float m2 = warp_sum(sq);
        if (lane == 0) {
            float* pair = bn2_partial + ((size_t)(tile * CONV_TILE_CHANNELS_STACKED + cl) * PF_PARTS + 2 * img + half) * 2;
            pair[0] = mean;
            pair[1] = m2;
        }
    }
    stamp(stamps, 4);
    grid_wait(sync);
    stamp(stamps, 5);

    // ---- 3. BN2's statistics of channels c2 .. c2 + 15, then BN2 -> ReLU -> pool of them in this image ----
    const int c2 = tile * 32 + half * 16;
    {
        constexpr int PER_LANE = CEIL_DIV(PF_PARTS, 32);
        float2 pairs[4][PER_LANE];  // the warp's 4 channels' parts: every load in flight at once
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) {
                const int part = lane + 32 * i;
                pairs[k][i] = part < PF_PARTS ? __ldcg(reinterpret_cast<const float2*>(bn2_partial) +
                                                       (size_t)(c2 + 4 * warp + k) * PF_PARTS + part)
                                              : make_float2(0.0f, 0.0f);
            }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float s = 0.0f, q = 0.0f;
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) s += pairs[k][i].x;
            const float mean = warp_sum(s) / PF_PARTS;  // every part has HW values
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) {
                const float d = lane + 32 * i < PF_PARTS ? pairs[k][i].x - mean : 0.0f;
                q += pairs[k][i].y + HW * d * d;
            }
            const float var = warp_sum(q) / (PF_PARTS * HW);
            if (lane == 0) {
                const int cl = 4 * warp + k;
                bn2[0][cl] = mean;
                bn2[1][cl] = rsqrtf(var + eps);
                if (img == 0) batchnorm_finalize(c2 + cl, mean, var, (float)(PF_PARTS * HW), eps, momentum, mean2,
                                                 invstd2, running_mean2, running_var2);
            }
        }
    }
    __syncthreads();
    {
        constexpr int POOLED = 49, TASKS = 16 * POOLED, PER_THREAD = CEIL_DIV(TASKS, CONV_THREADS);
        float2 top[PER_THREAD], bottom[PER_THREAD];
#pragma unroll
        for (int r = 0; r < PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, cl = e / POOLED, t = e % POOLED;
            if (e < TASKS) {
                const float* row = a2 + (((size_t)img * PF_C2 + c2 + cl) * S2 + 2 * (t / 7)) * S2 + 2 * (t % 7);
                top[r] = __ldcg(reinterpret_cast<const float2*>(row));
                bottom[r] = __ldcg(reinterpret_cast<const float2*>(row + S2));
            }
        }
#pragma unroll
        for (int r = 0; r < PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, cl = e / POOLED, t = e % POOLED;
            if (e < TASKS) {
                const float m = bn2[0][cl], is = bn2[1][cl], g = gamma2[c2 + cl], be = beta2[c2 + cl];
                int at;
                const size_t idx = ((size_t)img * PF_C2 + c2 + cl) * POOLED + t;
                const float v = relu_max4(batchnorm_apply(top[r].x, m, is, g, be), batchnorm_apply(top[r].y, m, is, g, be),
                                          batchnorm_apply(bottom[r].x, m, is, g, be),
                                          batchnorm_apply(bottom[r].y, m, is, g, be), &at);
                out2[idx] = v;
                argmax2[idx] = pool_position(v, at);
            }
        }
    }
    stamp(stamps, 6);
    grid_wait(sync);
    stamp(stamps, 7);

    // ---- 4. fc1 over 64 features at a time: item b = (slice b / 4, rows 32 (b % 4) ..) ----
    if (b < PF_ITEMS) {
        const int slice = b / 4, rows0 = b % 4 * PF_ROW_GROUP, k0 = slice * PF_K_SLICE;
        float* xs = reinterpret_cast<float*>(persistent_shared);  // [k][PF_BATCH + 4]
        float* ws = xs + PF_K_SLICE * (PF_BATCH + 4);              // [k][PF_ROW_GROUP + 4]
        constexpr int XQ = PF_BATCH * PF_K_SLICE / 4, WQ = PF_ROW_GROUP * PF_K_SLICE / 4;
        constexpr int XQ_PER = CEIL_DIV(XQ, CONV_THREADS), WQ_PER = CEIL_DIV(WQ, CONV_THREADS);
        float4 xv[XQ_PER], wv[WQ_PER];
#pragma unroll
        for (int r = 0; r < XQ_PER; r++) {
            const int e = tid + r * CONV_THREADS, s = e / (PF_K_SLICE / 4), q = e % (PF_K_SLICE / 4);
            if (e < XQ) xv[r] = __ldcg(reinterpret_cast<const float4*>(out2 + (size_t)s * PF_FEATURES + k0) + q);
        }
#pragma unroll
        for (int r = 0; r < WQ_PER; r++) {
            const int e = tid + r * CONV_THREADS, o = e / (PF_K_SLICE / 4), q = e % (PF_K_SLICE / 4);
            if (e < WQ) wv[r] = *(reinterpret_cast<const float4*>(fc1_w + (size_t)(rows0 + o) * PF_FEATURES + k0) + q);
        }
        // a row's 4 consecutive k (float4 v of row `row`) into the k-major tile t with `stride` floats per k
        const auto transpose4 = [](float* t, int stride, int k, int row, float4 v) {
            t[(k + 0) * stride + row] = v.x;
            t[(k + 1) * stride + row] = v.y;
            t[(k + 2) * stride + row] = v.z;
            t[(k + 3) * stride + row] = v.w;
        };
#pragma unroll
        for (int r = 0; r < XQ_PER; r++) {
            const int e = tid + r * CONV_THREADS;
            if (e < XQ) transpose4(xs, PF_BATCH + 4, 4 * (e % (PF_K_SLICE / 4)), e / (PF_K_SLICE / 4), xv[r]);
        }
#pragma unroll
        for (int r = 0; r < WQ_PER; r++) {
            const int e = tid + r * CONV_THREADS;
            if (e < WQ) transpose4(ws, PF_ROW_GROUP + 4, 4 * (e % (PF_K_SLICE / 4)), e / (PF_K_SLICE / 4), wv[r]);
        }
        __syncthreads();
        // thread: samples 4 (tid / 8) .. + 3 (of 64; PF_BATCH = 64 fills them), rows 4 (tid % 8) .. + 3
        const int s0 = 4 * (tid / 8), o0 = 4 * (tid % 8);
        float acc[4][4] = {};
        if (s0 < PF_BATCH) {
#pragma unroll 8
            for (int k = 0; k < PF_K_SLICE; k++) {
                const float4 xq = *reinterpret_cast<const float4*>(xs + k * (PF_BATCH + 4) + s0);
                const float4 wq = *reinterpret_cast<const float4*>(ws + k * (PF_ROW_GROUP + 4) + o0);
                const float xa[4] = {xq.x, xq.y, xq.z, xq.w}, wa[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] = fmaf(xa[i], wa[j], acc[i][j]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
                *reinterpret_cast<float4*>(fc1_partial + ((size_t)slice * PF_BATCH + s0 + i) * PF_HIDDEN + rows0 + o0) =
                    make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        }
    }
    stamp(stamps, 8);
    grid_wait(sync);
    stamp(stamps, 9);

    // ---- 5. the head, sample b ----
    if (b < PF_BATCH) {
        float* f = head_s;                       // relu(fc1) of the sample
        float* z = head_s + PF_HIDDEN;           // logits, then dlogits
        const int label = labels[b];
        const float pre = sum_in_order(fc1_partial + (size_t)b * PF_HIDDEN + tid, PF_SLICES,
                                       (size_t)PF_BATCH * PF_HIDDEN) + fc1_b[tid];
        const float h = relu(pre);
        f[tid] = h;
        fc1_out[b * PF_HIDDEN + tid] = h;
        __syncthreads();
        for (int j = warp; j < NUM_CLASSES; j += CONV_THREADS / 32) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < PF_HIDDEN / 32; i++) s = fmaf(fc2_w[j * PF_HIDDEN + lane + 32 * i], f[lane + 32 * i], s);
            s = warp_sum(s);
            if (lane == 0) z[j] = s + fc2_b[j];
        }
        __syncthreads();
        if (tid == 0) {
            float zmax = z[0];
            for (int j = 1; j < NUM_CLASSES; j++) zmax = fmaxf(zmax, z[j]);
            float se = 0.0f;
            for (int j = 0; j < NUM_CLASSES; j++) se += expf(z[j] - zmax);
            const float lse = zmax + logf(se);
            sample_loss[b] = lse - z[label];
            for (int j = 0; j < NUM_CLASSES; j++) {
                logits[b * NUM_CLASSES + j] = z[j];
                z[NUM_CLASSES + j] = (expf(z[j] - lse) - (j == label ? 1.0f : 0.0f)) / PF_BATCH;
            }
        }
        __syncthreads();
        float g = 0.0f;
#pragma unroll
        for (int j = 0; j < NUM_CLASSES; j++) g = fmaf(fc2_w[j * PF_HIDDEN + tid], z[NUM_CLASSES + j], g);
        d_pre[b * PF_HIDDEN + tid] = h > 0.0f ? g : 0.0f;
    }
    stamp(stamps, 10);
}
