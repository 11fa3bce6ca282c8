// 3_bn_relu_pool.cu: the second block's BatchNorm fused with ReLU and max pooling (a = conv2's output
// [N,C,S,S], S even): the fast form of naive/3_batchnorm.cu, 4_relu.cu and 5_maxpool.cu for block 2, forward
// and backward (the forward and the backward's apply in two forms each: a thread per window, or staged, a block of
// BN_STAGED_PLANES planes at a time). Reductions are split into parts of imgs_per_block images (at most MAX_PARTS), one
// warp per channel, BN_CHANNELS channels per block of BN_THREADS threads (both from mnist_cuda/ops/bn_relu_pool.py);
// for each group of channels, the last of its blocks combines the parts in a fixed order
// (last_block_done). counter: one per group.
// conv2's output a and its gradient d_a, the pooled output and its gradient (fc1's input and its gradient), and a at
// each window's position (a_at), are float32, or bf16 with --precision bf16 (T: float or bfloat16, common.cuh);
// everything else, the statistics and sums included, is float32. Several models at once (common.cuh), in every kernel
// but batchnorm_eval_stats_fast (evaluation, one model) and batchnorm_stats_from_parts_fast and _from_tiles_fast
// (conv2's forward's moments, one model): the grid's z is the model; a, the pooled tensors and their gradients are
// [models][N][...], mean and invstd [models][C], the reductions' partial [models][MAX_PARTS * C * 2] and counter
// [models][groups]; gamma, beta and their gradients are param_stride floats apart, the running statistics
// running_stride.
#include "common.cuh"
#include "part_reduce.cuh"
#include "tensor_core.cuh"
#if !defined(BN_CHANNELS) || !defined(BN_THREADS) || !defined(BN_TILES_THREADS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#if !defined(BN_STAGED_PLANES) || !defined(BN_STAGED_THREADS) || !defined(BN_STAGED_WINDOWS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
static_assert(BN_THREADS == 32 * BN_CHANNELS, "a warp per channel");

// Per (channel, part) mean and M2, merged by each group's last block, which finalizes BatchNorm. A warp
// owns a channel: it holds BN_STATS_IMAGES images' HW values in registers (loaded together: one memory
// latency for them all), takes each image's mean and squared deviations (two passes over registers), and
// merges them into the part's running (mean, M2) with Chan's formula, in image order.
// grid (parts, ceil(C/BN_CHANNELS), models), BN_THREADS threads; partial [C, parts, 2] per model.
// HW <= 32 * BN_STATS_VALUES.
#define BN_STATS_VALUES 7  // per lane and image: 7 * 32 >= 196, conv2's 14x14
#define BN_STATS_IMAGES 2  // images whose loads a warp has in flight together (one left its latency exposed)

// Images n0 .. n0 + K - 1 of channel c merged into (mean, m2, count), by the warp that owns c.
template <int K, class T>
__device__ __forceinline__ void stats_images(const T* a, int n0, int C, int c, int HW, float* mean, float* m2,
                                             float* count) {
    const int lane = threadIdx.x % 32;
    float v[K][BN_STATS_VALUES];
#pragma unroll
    for (int j = 0; j < K; j++)
#pragma unroll
        for (int i = 0; i < BN_STATS_VALUES; i++) {
            const int p = lane + 32 * i;
            v[j][i] = p < HW ? load_value(a + ((n0 + j) * C + c) * HW + p) : 0.0f;
        }
#pragma unroll
    for (int j = 0; j < K; j++) {
        float sum = 0.0f, sq = 0.0f;
#pragma unroll
        for (int i = 0; i < BN_STATS_VALUES; i++) sum += v[j][i];
        const float image_mean = warp_sum(sum) / HW;
#pragma unroll
        for (int i = 0; i < BN_STATS_VALUES; i++) {
            const float d = lane + 32 * i < HW ? v[j][i] - image_mean : 0.0f;
            sq += d * d;
        }
        chan_merge(mean, m2, count, image_mean, warp_sum(sq), (float)HW);
    }
}

template <class T>
__global__ void __launch_bounds__(BN_THREADS)
    batchnorm_stats_fast(const T* a, int N, int C, int HW, int imgs_per_block, float* partial, unsigned int* counter,
                         float eps, float momentum, float* save_mean, float* save_invstd, float* running_mean,
                         float* running_var, int running_stride) {
    const int model = model_index();
    a = model_part(a, (size_t)N * C * HW, model);
    partial = model_part(partial, (size_t)MAX_PARTS * C * 2, model);
    counter = model_part(counter, gridDim.y, model);
    save_mean = model_part(save_mean, C, model);
    save_invstd = model_part(save_invstd, C, model);
    running_mean = model_part(running_mean, running_stride, model);
    running_var = model_part(running_var, running_stride, model);
    const int lane = threadIdx.x % 32, c = blockIdx.y * BN_CHANNELS + threadIdx.x / 32;
    const int first = blockIdx.x * imgs_per_block, last = min(N, first + imgs_per_block);
    if (c < C) {
        float mean = 0.0f, m2 = 0.0f, count = 0.0f;
        int n = first;
        for (; n + BN_STATS_IMAGES <= last; n += BN_STATS_IMAGES)
            stats_images<BN_STATS_IMAGES>(a, n, C, c, HW, &mean, &m2, &count);
        for (; n < last; n++) stats_images<1>(a, n, C, c, HW, &mean, &m2, &count);
        if (lane == 0) {
            float* pair = part_pair(partial, c, gridDim.x, blockIdx.x);
            pair[0] = mean;
            pair[1] = m2;
        }
    }
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    batchnorm_merge_finalize(partial, gridDim.x, imgs_per_block, N, HW, blockIdx.y * BN_CHANNELS,
                             min(C, blockIdx.y * BN_CHANNELS + BN_CHANNELS), eps, momentum, save_mean, save_invstd,
                             running_mean, running_var);
}

// The statistics from the (mean, M2) pairs conv2's persistent forward leaves in partial [C, parts, 2], one model:
// `parts` blocks took tiles b, b + parts, .. of `tiles` tiles, tile_values values of each channel a tile.
// grid ceil(C / BN_CHANNELS), BN_THREADS threads (a warp per channel); parts <= 32 * BN_FROM_PARTS_PER_LANE.
#define BN_FROM_PARTS_PER_LANE 16
extern "C" __global__ void __launch_bounds__(BN_THREADS)
    batchnorm_stats_from_parts_fast(const float* partial, int parts, int tiles, int tile_values, int C, float eps,
                                    float momentum, float* save_mean, float* save_invstd, float* running_mean,
                                    float* running_var) {
    const auto count_of = [&](int b) { return (float)((tiles - b + parts - 1) / parts * tile_values); };
    batchnorm_merge_finalize<BN_FROM_PARTS_PER_LANE>(
        partial, parts, count_of, (float)tiles * tile_values, blockIdx.x * BN_CHANNELS,
        min(C, (int)(blockIdx.x + 1) * BN_CHANNELS), eps, momentum, save_mean, save_invstd, running_mean, running_var);
}

// The statistics from the (mean, M2) pairs conv2's 3xTF32 forward leaves a block per tile in partial [C, tiles, 2],
// one model: tile_values values of each channel a tile. Thousands of parts a channel (8,192 at 4096 images) are too
// many for a warp's registers, so a block merges a channel, in one pass over its pairs: Chan et al.'s merge with
// equal counts n, each tile's mean taken from a shift (tile 0's, near the channel's mean): with d_b = mean_b - shift,
// mean = shift + sum(d_b) / tiles, M2 = sum(M2_b + n d_b^2) - n tiles (sum(d_b) / tiles)^2. Thread i sums pairs
// i, i + blockDim.x, .. (its BN_TILES_LOADS loads in flight together), then block_sum's fixed order.
// grid C, BN_TILES_THREADS threads.
#define BN_TILES_LOADS 16
extern "C" __global__ void __launch_bounds__(BN_TILES_THREADS)
    batchnorm_stats_from_tiles_fast(const float* partial, int tiles, int tile_values, float eps, float momentum,
                                    float* save_mean, float* save_invstd, float* running_mean, float* running_var) {
    const int c = blockIdx.x;
    const float2* pairs = reinterpret_cast<const float2*>(partial) + (size_t)c * tiles;
    const float shift = __ldcg(pairs).x, n = (float)tile_values;
    float s = 0.0f, q = 0.0f;
    for (int base = threadIdx.x; base < tiles; base += BN_TILES_LOADS * blockDim.x) {
        float2 v[BN_TILES_LOADS];
#pragma unroll
        for (int i = 0; i < BN_TILES_LOADS; i++) {
            const int b = base + i * blockDim.x;
            v[i] = b < tiles ? __ldcg(pairs + b) : make_float2(shift, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < BN_TILES_LOADS; i++) {
            const float d = v[i].x - shift;
            s += d;
            q += fmaf(n * d, d, v[i].y);
        }
    }
    s = block_sum(s);
    q = block_sum(q);
    const float total = (float)tiles * n, mean_d = s / tiles;
    if (threadIdx.x == 0)
        batchnorm_finalize(c, shift + mean_d, fmaxf(q - total * mean_d * mean_d, 0.0f) / total, total, eps, momentum,
                           save_mean, save_invstd, running_mean, running_var);
}

// Evaluation: the statistics the fused forward kernels normalise with become the running ones:
// mean = running_mean, invstd = 1/sqrt(running_var + eps). C threads.
extern "C" __global__ void batchnorm_eval_stats_fast(const float* running_mean, const float* running_var, float eps,
                                                     int C, float* mean, float* invstd) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    mean[c] = running_mean[c];
    invstd[c] = rsqrtf(running_var[c] + eps);
}

// One 2x2 window of BatchNorm + ReLU + max pool, its two rows as pairs: the pooled value, its position
// (pool_position: NO_POSITION where the ReLU blocked the window) and a's value there (*a_at).
__device__ __forceinline__ float bn_relu_pool_window(float2 top, float2 bottom, float m, float is, float g, float b,
                                                     int* position, float* a_at) {
    int at;
    const float v = relu_max4(batchnorm_apply(top.x, m, is, g, b), batchnorm_apply(top.y, m, is, g, b),
                              batchnorm_apply(bottom.x, m, is, g, b), batchnorm_apply(bottom.y, m, is, g, b), &at);
    *position = pool_position(v, at);
    *a_at = at == 0 ? top.x : at == 1 ? top.y : at == 2 ? bottom.x : bottom.y;
    return v;
}

// pooled = maxpool2x2(relu(batchnorm(a))) with the window position, NO_POSITION where the ReLU blocked
// the window (pool_position), and a_at, a at that position: the backward reads the position alone, and
// its reduction reads a_at instead of gathering a at the positions (a quarter of a's values, nearly all of
// its sectors). One thread per pooled pixel, reading its window as two rows of two (load_pair): the form for small
// batches, where the staged form's chain per block (copy, barrier) is the longer one. T: a's,
// pooled's and a_at's type (bfloat16 in --precision bf16: conv2's output and fc1's input, pooled rounded to the
// nearest, a_at exact, a value of a; the position is taken from the float value).
template <class T>
__global__ void batchnorm_relu_maxpool_fast(const T* a, const float* mean, const float* invstd, const float* gamma,
                                            const float* beta, int N, int C, int S, T* pooled, unsigned char* argmax,
                                            T* a_at, int param_stride) {
    const int So = S / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * So * So) return;
    const int model = model_index();
    const size_t pooled_size = (size_t)N * C * So * So;
    a = model_part(a, (size_t)N * C * S * S, model);
    mean = model_part(mean, C, model);
    invstd = model_part(invstd, C, model);
    gamma = model_part(gamma, param_stride, model);
    beta = model_part(beta, param_stride, model);
    pooled = model_part(pooled, pooled_size, model);
    argmax = model_part(argmax, pooled_size, model);
    a_at = model_part(a_at, pooled_size, model);
    const int pw = idx % So, ph = (idx / So) % So, nc = idx / (So * So), c = nc % C;
    const T* row = a + (nc * S + 2 * ph) * S + 2 * pw;
    int position;
    float at_value;
    const float v = bn_relu_pool_window(load_pair(row), load_pair(row + S), mean[c], invstd[c], gamma[c], beta[c],
                                        &position, &at_value);
    store_value(pooled + idx, v);
    argmax[idx] = position;
    store_value(a_at + idx, at_value);
}

// dbeta = sum dz, dgamma = sum dz*xhat, where dz (the gradient at BN's output) is nonzero only at each
// window's argmax where the ReLU passed (argmax != NO_POSITION): the sums run over pooled pixels, with a
// at the argmax from the forward (a_at). A warp owns a channel; each lane loads its pooled pixels'
// (gradient, argmax, a_at) for BN_REDUCE_IMAGES images at once: one memory latency for them all.
// grid (parts, ceil(C/BN_CHANNELS), models), BN_THREADS threads; So*So <= 32 * BN_POOLED_VALUES.
#define BN_POOLED_VALUES 2  // per lane and image: 64 >= 49, conv2's 7x7 pooled pixels
#define BN_REDUCE_IMAGES 2  // images whose loads a warp has in flight together

// Images n0 .. n0 + K - 1 of channel c added to (sdz, sdzx) in image order, by the warp that owns c.
template <int K, class T>
__device__ __forceinline__ void reduce_images(const T* a_at, const T* d_pooled, const unsigned char* argmax, int n0,
                                              int C, int c, int pooled_hw, float mean, float invstd, float* sdz,
                                              float* sdzx) {
    const int lane = threadIdx.x % 32;
    float dz[K][BN_POOLED_VALUES], aa[K][BN_POOLED_VALUES];
    bool passed[K][BN_POOLED_VALUES];
#pragma unroll
    for (int j = 0; j < K; j++)
#pragma unroll
        for (int i = 0; i < BN_POOLED_VALUES; i++) {
            const int t = lane + 32 * i, idx = ((n0 + j) * C + c) * pooled_hw + t;
            const bool in = t < pooled_hw;
            dz[j][i] = in ? load_value(d_pooled + idx) : 0.0f;
            aa[j][i] = in ? load_value(a_at + idx) : 0.0f;
            passed[j][i] = in && argmax[idx] != NO_POSITION;
        }
#pragma unroll
    for (int j = 0; j < K; j++)
#pragma unroll
        for (int i = 0; i < BN_POOLED_VALUES; i++)
            if (passed[j][i]) {
                *sdz += dz[j][i];
                *sdzx += dz[j][i] * (aa[j][i] - mean) * invstd;
            }
}

// T: d_pooled's and a_at's type (bfloat16 in --precision bf16: fc1's input gradient, and a at the argmax).
template <class T>
__global__ void __launch_bounds__(BN_THREADS)
    batchnorm_backward_reduce_fast(const T* a_at, const float* save_mean, const float* save_invstd, const T* d_pooled,
                                   const unsigned char* argmax, int N, int C, int S, int imgs_per_block, float* partial,
                                   unsigned int* counter, float* dgamma, float* dbeta, int param_stride) {
    const int model = model_index();
    const size_t pooled_size = (size_t)N * C * (S / 2) * (S / 2);
    a_at = model_part(a_at, pooled_size, model);
    d_pooled = model_part(d_pooled, pooled_size, model);
    argmax = model_part(argmax, pooled_size, model);
    save_mean = model_part(save_mean, C, model);
    save_invstd = model_part(save_invstd, C, model);
    partial = model_part(partial, (size_t)MAX_PARTS * C * 2, model);
    counter = model_part(counter, gridDim.y, model);
    dgamma = model_part(dgamma, param_stride, model);
    dbeta = model_part(dbeta, param_stride, model);
    const int lane = threadIdx.x % 32, c = blockIdx.y * BN_CHANNELS + threadIdx.x / 32, pooled_hw = (S / 2) * (S / 2);
    const int first = blockIdx.x * imgs_per_block, last = min(N, first + imgs_per_block);
    float sdz = 0.0f, sdzx = 0.0f;
    if (c < C) {
        const float mean = save_mean[c], invstd = save_invstd[c];
        int n = first;
        for (; n + BN_REDUCE_IMAGES <= last; n += BN_REDUCE_IMAGES)
            reduce_images<BN_REDUCE_IMAGES>(a_at, d_pooled, argmax, n, C, c, pooled_hw, mean, invstd, &sdz, &sdzx);
        for (; n < last; n++) reduce_images<1>(a_at, d_pooled, argmax, n, C, c, pooled_hw, mean, invstd, &sdz, &sdzx);
    }
    sdz = warp_sum(sdz);
    sdzx = warp_sum(sdzx);
    if (c < C && lane == 0) {
        float* pair = part_pair(partial, c, gridDim.x, blockIdx.x);
        pair[0] = sdz;
        pair[1] = sdzx;
    }
    if (!last_block_done(counter + blockIdx.y, gridDim.x)) return;
    sum_parts_pairs(partial, gridDim.x, blockIdx.y * BN_CHANNELS, min(C, blockIdx.y * BN_CHANNELS + BN_CHANNELS), dbeta,
                    dgamma);
}

// BatchNorm's input gradient at one value x of a channel: gamma invstd / count (count dz - dbeta - xhat dgamma),
// with k = gamma invstd / count.
__device__ __forceinline__ float bn_input_grad(float x, float dz, float mean, float invstd, float k, float count,
                                               float db, float dg) {
    const float xhat = (x - mean) * invstd;
    return k * (count * dz - db - xhat * dg);
}

// d_a = gamma*invstd/count * (count*dz - dbeta - xhat*dgamma) over every element (dense), dz rebuilt from the pooled
// gradient at the window's argmax (none where it is NO_POSITION): one thread per 2x2 window, reading and writing its
// two rows as pairs, 6 memory instructions of 1 to 8 bytes per 4 values besides its channel's five coefficients. The
// form for small batches, where the staged form's chain per block (copy, barrier, write) is the longer one
// (mnist_cuda/ops/bn_relu_pool.py chooses). T: a's, d_pooled's and d_a's type (bfloat16 in --precision bf16).
template <class T>
__global__ void batchnorm_backward_apply_fast(const T* a, const float* save_mean, const float* save_invstd,
                                              const float* gamma, const float* dgamma, const float* dbeta,
                                              const T* d_pooled, const unsigned char* argmax, int N, int C, int S,
                                              T* d_a, int param_stride) {
    const int So = S / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * So * So) return;
    const int model = model_index();
    const size_t pooled_size = (size_t)N * C * So * So, size = (size_t)N * C * S * S;
    a = model_part(a, size, model);
    d_a = model_part(d_a, size, model);
    d_pooled = model_part(d_pooled, pooled_size, model);
    argmax = model_part(argmax, pooled_size, model);
    save_mean = model_part(save_mean, C, model);
    save_invstd = model_part(save_invstd, C, model);
    gamma = model_part(gamma, param_stride, model);
    dgamma = model_part(dgamma, param_stride, model);
    dbeta = model_part(dbeta, param_stride, model);
    const int pw = idx % So, ph = (idx / So) % So, nc = idx / (So * So), c = nc % C;
    const float count = (float)N * S * S, mean = save_mean[c], invstd = save_invstd[c];
    const float k = gamma[c] * invstd / count, db = dbeta[c], dg = dgamma[c];
    const float dz = load_value(d_pooled + idx);
    const int at = argmax[idx];
    const int base = (nc * S + 2 * ph) * S + 2 * pw;
    const float2 top = load_pair(a + base), bottom = load_pair(a + base + S);
    const float v[4] = {top.x, top.y, bottom.x, bottom.y};
    float out[4];
#pragma unroll
    for (int p = 0; p < 4; p++) out[p] = bn_input_grad(v[p], p == at ? dz : 0.0f, mean, invstd, k, count, db, dg);
    store_pair(d_a + base, out[0], out[1]);
    store_pair(d_a + base + S, out[2], out[3]);
}

// Whether `values` values of type T from `from` to `to` are whole 16-byte units at both ends.
template <class T>
__device__ __forceinline__ bool whole_units(const void* from, const void* to, int values) {
    return (reinterpret_cast<size_t>(from) | reinterpret_cast<size_t>(to) | (values * sizeof(T))) % 16 == 0;
}

// values of type T from global memory into shared memory: by cp.async in 16-byte units where whole_units, else value
// by value (loads, then stores: the caller's barrier shows either).
template <class T>
__device__ __forceinline__ void stage_run(const T* from, T* to, int values) {
    if (whole_units<T>(from, to, values)) {
        for (int i = threadIdx.x; i < values * (int)sizeof(T) / 16; i += BN_STAGED_THREADS)
            cp_async16(reinterpret_cast<float*>(to) + 4 * i, reinterpret_cast<const float*>(from) + 4 * i);
    } else {
        for (int i = threadIdx.x; i < values; i += BN_STAGED_THREADS) to[i] = from[i];
    }
}

// ... and from shared memory out to global memory.
template <class T>
__device__ __forceinline__ void write_run(const T* from, T* to, int values) {
    if (whole_units<T>(from, to, values)) {
        const uint4* f = reinterpret_cast<const uint4*>(from);
        uint4* d = reinterpret_cast<uint4*>(to);
        for (int i = threadIdx.x; i < values * (int)sizeof(T) / 16; i += BN_STAGED_THREADS) d[i] = f[i];
    } else {
        for (int i = threadIdx.x; i < values; i += BN_STAGED_THREADS) to[i] = from[i];
    }
}

// batchnorm_backward_apply_fast's d_a, the same values from the same arithmetic, staged (the form for large
// batches): a block takes BN_STAGED_PLANES whole (image, channel) planes of a, contiguous in memory. It copies them
// into shared memory by cp.async in 16-byte units, with their pooled gradients and positions, every copy in flight at
// once; a thread per 2x2 window rewrites its four values there in place; the block writes the planes out to d_a in
// 16-byte units. About one memory instruction per 16 bytes (docs/performance.md). A run that is not whole 16-byte
// units at both ends (another model's part, a batch's last planes) goes value by value.
// grid (ceil(N*C / BN_STAGED_PLANES), 1, models), BN_STAGED_THREADS threads; S even, (S/2)^2 <= BN_STAGED_WINDOWS.
// T: a's, d_pooled's and d_a's type (bfloat16 in --precision bf16).
template <class T>
__global__ void __launch_bounds__(BN_STAGED_THREADS)
    batchnorm_backward_apply_staged_fast(const T* a, const float* save_mean, const float* save_invstd,
                                         const float* gamma, const float* dgamma, const float* dbeta, const T* d_pooled,
                                         const unsigned char* argmax, int N, int C, int S, T* d_a, int param_stride) {
    __shared__ __align__(16) T planes_s[BN_STAGED_PLANES * 4 * BN_STAGED_WINDOWS];
    __shared__ __align__(16) T dz_s[BN_STAGED_PLANES * BN_STAGED_WINDOWS];
    __shared__ __align__(16) unsigned char at_s[BN_STAGED_PLANES * BN_STAGED_WINDOWS];
    __shared__ float coef_s[BN_STAGED_PLANES][5];  // mean, invstd, k, dbeta, dgamma of the plane's channel
    const int model = model_index();
    const int So = S / 2, W = So * So, SS = S * S, p0 = blockIdx.x * BN_STAGED_PLANES;
    const int planes = min(BN_STAGED_PLANES, N * C - p0);
    const size_t pooled_size = (size_t)N * C * W, size = (size_t)N * C * SS;
    a = model_part(a, size, model) + (size_t)p0 * SS;
    d_a = model_part(d_a, size, model) + (size_t)p0 * SS;
    d_pooled = model_part(d_pooled, pooled_size, model) + (size_t)p0 * W;
    argmax = model_part(argmax, pooled_size, model) + (size_t)p0 * W;
    save_mean = model_part(save_mean, C, model);
    save_invstd = model_part(save_invstd, C, model);
    gamma = model_part(gamma, param_stride, model);
    dgamma = model_part(dgamma, param_stride, model);
    dbeta = model_part(dbeta, param_stride, model);
    stage_run(a, planes_s, planes * SS);
    stage_run(d_pooled, dz_s, planes * W);
    stage_run(argmax, at_s, planes * W);
    cp_async_commit();
    const float count = (float)N * S * S;
    if (threadIdx.x < planes) {  // while the copies are in flight
        const int c = (p0 + threadIdx.x) % C;
        const float invstd = save_invstd[c];
        float* coef = coef_s[threadIdx.x];
        coef[0] = save_mean[c];
        coef[1] = invstd;
        coef[2] = gamma[c] * invstd / count;
        coef[3] = dbeta[c];
        coef[4] = dgamma[c];
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int i = threadIdx.x; i < planes * W; i += BN_STAGED_THREADS) {
        const int plane = i / W, w = i % W, at = at_s[i];
        const float* coef = coef_s[plane];
        const float mean = coef[0], invstd = coef[1], k = coef[2], db = coef[3], dg = coef[4];
        const float dz = load_value(dz_s + i);
        T* window = planes_s + plane * SS + 2 * (w / So) * S + 2 * (w % So);
        const float2 top = load_pair(window), bottom = load_pair(window + S);
        const float v[4] = {top.x, top.y, bottom.x, bottom.y};
        float out[4];
#pragma unroll
        for (int p = 0; p < 4; p++) out[p] = bn_input_grad(v[p], p == at ? dz : 0.0f, mean, invstd, k, count, db, dg);
        store_pair(window, out[0], out[1]);
        store_pair(window + S, out[2], out[3]);
    }
    __syncthreads();
    write_run(static_cast<const T*>(planes_s), d_a, planes * SS);
}

// batchnorm_relu_maxpool_fast's outputs, the same values from the same arithmetic (bn_relu_pool_window), staged (the
// form for large batches): a block takes BN_STAGED_PLANES whole (image, channel) planes of a, contiguous in memory,
// copies them into shared memory by cp.async in 16-byte units, every copy in flight at once; a thread per 2x2 window
// reads its window there and writes its three outputs, consecutive threads consecutive windows (staging the outputs
// too is slower: docs/performance.md).
// grid (ceil(N*C / BN_STAGED_PLANES), 1, models), BN_STAGED_THREADS threads; S even, (S/2)^2 <= BN_STAGED_WINDOWS.
template <class T>
__global__ void __launch_bounds__(BN_STAGED_THREADS)
    batchnorm_relu_maxpool_staged_fast(const T* a, const float* mean, const float* invstd, const float* gamma,
                                       const float* beta, int N, int C, int S, T* pooled, unsigned char* argmax,
                                       T* a_at, int param_stride) {
    __shared__ __align__(16) T planes_s[BN_STAGED_PLANES * 4 * BN_STAGED_WINDOWS];
    __shared__ float coef_s[BN_STAGED_PLANES][4];  // mean, invstd, gamma, beta of the plane's channel
    const int model = model_index();
    const int So = S / 2, W = So * So, SS = S * S, p0 = blockIdx.x * BN_STAGED_PLANES;
    const int planes = min(BN_STAGED_PLANES, N * C - p0);
    const size_t pooled_size = (size_t)N * C * W;
    a = model_part(a, (size_t)N * C * SS, model) + (size_t)p0 * SS;
    pooled = model_part(pooled, pooled_size, model) + (size_t)p0 * W;
    argmax = model_part(argmax, pooled_size, model) + (size_t)p0 * W;
    a_at = model_part(a_at, pooled_size, model) + (size_t)p0 * W;
    mean = model_part(mean, C, model);
    invstd = model_part(invstd, C, model);
    gamma = model_part(gamma, param_stride, model);
    beta = model_part(beta, param_stride, model);
    stage_run(a, planes_s, planes * SS);
    cp_async_commit();
    if (threadIdx.x < planes) {  // while the copies are in flight
        const int c = (p0 + threadIdx.x) % C;
        float* coef = coef_s[threadIdx.x];
        coef[0] = mean[c];
        coef[1] = invstd[c];
        coef[2] = gamma[c];
        coef[3] = beta[c];
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int i = threadIdx.x; i < planes * W; i += BN_STAGED_THREADS) {
        const int plane = i / W, w = i % W;
        const float* coef = coef_s[plane];
        const T* window = planes_s + plane * SS + 2 * (w / So) * S + 2 * (w % So);
        int position;
        float at_value;
        const float v = bn_relu_pool_window(load_pair(window), load_pair(window + S), coef[0], coef[1], coef[2],
                                            coef[3], &position, &at_value);
        store_value(pooled + i, v);
        argmax[i] = position;
        store_value(a_at + i, at_value);
    }
}
