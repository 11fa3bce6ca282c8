// Rung 04, x at the argmax: rung 03 with the sums reading x_at, x at each window's position as the forward
// stores it, where rung 03 gathers x itself at the positions.
//   dz[n,c,h,w] = d_pooled[n,c,h/2,w/2] where position[n,c,h/2,w/2] names (h,w) in its window, else 0
//   (position: the window's argmax, or NO_POSITION where the ReLU blocked the window);
//   dbeta[c] = sum dz, dgamma[c] = sum dz xhat, xhat = (x - mean[c]) invstd[c] (sums over N x S x S = count);
//   dx = gamma[c] invstd[c] / count (count dz - dbeta[c] - xhat dgamma[c])
//
// What it adds over rung 03: the reduction reads pooled-size arrays alone. The gather of rung 03 loads one float
// of each 2 x 2 window at a position that changes from window to window, so a warp's loads scatter over two rows
// of x and touch nearly all of its sectors, after the position's own load (a second latency). The product's
// forward, which picks the position, stores x there as it goes (x_at [N,C,S/2,S/2], a quarter of x); reading it,
// the sums load 9 bytes per window (gradient, position, x_at) with consecutive threads on consecutive windows,
// the three loads independent of each other. apply is rung 03's. What it leaves: a block per (part, channel) with
// its block_sum barriers, for a part that at the network's geometry is one to eight images of 49 windows, most of
// its threads idle (rung 05).
//
// Launch (dev/ladder/bn_backward/op.py, launch_x_at): reduce: grid (parts, C), blocks of THREADS threads; apply:
// a thread per element of x, blocks of 256. THREADS, NO_POSITION, MAX_PARTS and MAX_CHANNELS come from there as -D
// options; the scratch, part_sums and blocks_done, is this module's own memory, sized from them.
#if !defined(THREADS) || !defined(NO_POSITION) || !defined(MAX_PARTS) || !defined(MAX_CHANNELS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

__device__ float part_sums[MAX_CHANNELS * MAX_PARTS * 2];  // [C, parts, 2]: (sum dz, sum dz xhat) of each part
__device__ unsigned int blocks_done[MAX_CHANNELS] = {};    // per channel: its blocks that have written their pair

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the block (THREADS threads); every thread gets the total, added in an order fixed by THREADS.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// Block (part, c): the windows of images [part * imgs_per_part, min(N, (part + 1) * imgs_per_part)) in channel c.
extern "C" __global__ void __launch_bounds__(THREADS)
    bn_backward_rung04_x_at_reduce(const float* x_at, const float* mean, const float* invstd, const float* d_pooled,
                                   const unsigned char* position, int N, int C, int S, int imgs_per_part, float* dgamma,
                                   float* dbeta) {
    __shared__ bool last;
    const int part = blockIdx.x, parts = gridDim.x, c = blockIdx.y, So = S / 2, windows = So * So;
    const int first = part * imgs_per_part, images = min(N, first + imgs_per_part) - first;
    const float m = mean[c], is = invstd[c];
    float sdz = 0.0f, sdzx = 0.0f;
    for (int i = threadIdx.x; i < images * windows; i += THREADS) {
        const int n = first + i / windows, t = i % windows;
        const size_t window = (size_t)(n * C + c) * windows + t;
        const float g = d_pooled[window], xa = x_at[window];  // (loaded whatever the position says)
        if (position[window] != NO_POSITION) {
            sdz += g;
            sdzx += g * (xa - m) * is;
        }
    }
    sdz = block_sum(sdz);
    sdzx = block_sum(sdzx);
    float* sums = part_sums + (size_t)c * parts * 2;  // channel c's parts
    if (threadIdx.x == 0) {
        sums[2 * part] = sdz;
        sums[2 * part + 1] = sdzx;
    }

    __threadfence();  // the part's pair is visible device-wide before the count says so
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&blocks_done[c], 1u) == parts - 1;
        if (last) blocks_done[c] = 0u;  // every block of the channel has counted: ready for the next launch
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;  // (no barrier follows)
    __threadfence();

    // The last block's first warp: the parts in order (lane l takes parts l, l + 32, ...), read from L2 (__ldcg).
    float db = 0.0f, dg = 0.0f;
    for (int b = threadIdx.x; b < parts; b += 32) {
        db += __ldcg(sums + 2 * b);
        dg += __ldcg(sums + 2 * b + 1);
    }
    db = warp_sum(db);
    dg = warp_sum(dg);
    if (threadIdx.x == 0) {
        dbeta[c] = db;
        dgamma[c] = dg;
    }
}

// A thread per element of x [N,C,S,S]; dbeta and dgamma from reduce.
extern "C" __global__ void bn_backward_rung04_x_at_apply(const float* x, const float* mean, const float* invstd,
                                                         const float* gamma, const float* dgamma, const float* dbeta,
                                                         const float* d_pooled, const unsigned char* position, int N,
                                                         int C, int S, float* dx) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * S * S) return;
    const int w = idx % S, h = idx / S % S, nc = idx / (S * S), c = nc % C, So = S / 2;
    const float count = (float)N * S * S, is = invstd[c], k = gamma[c] * is / count;
    float dz = 0.0f;
    if (h / 2 < So && w / 2 < So) {
        const int window = (nc * So + h / 2) * So + w / 2;
        if (position[window] == (h % 2) * 2 + w % 2) dz = d_pooled[window];
    }
    dx[idx] = k * (count * dz - dbeta[c] - (x[idx] - mean[c]) * is * dgamma[c]);
}
