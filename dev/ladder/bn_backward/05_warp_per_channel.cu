// Rung 05, warp per channel: rung 04's sums by a warp per (part, channel), CHANNELS channels to a block, reduced
// with shuffles alone; the last block of each group of channels adds the group's parts.
//   dz[n,c,h,w] = d_pooled[n,c,h/2,w/2] where position[n,c,h/2,w/2] names (h,w) in its window, else 0
//   (position: the window's argmax, or NO_POSITION where the ReLU blocked the window);
//   dbeta[c] = sum dz, dgamma[c] = sum dz xhat, xhat = (x - mean[c]) invstd[c] (sums over N x S x S = count);
//   dx = gamma[c] invstd[c] / count (count dz - dbeta[c] - xhat dgamma[c])
//
// What it adds over rung 04: no barriers in the sums. A part of one image has 49 windows per
// channel at the network's geometry, and rung 04 gives them a block of THREADS threads and two block_sum barriers.
// Here a warp owns a channel of the part: lane l takes windows l, l + 32, ... of each image in turn (coalesced, as
// in rung 04), adds into its own two registers, and one warp_sum of each ends the part. CHANNELS warps take
// CHANNELS channels of the same part, with one counter per group of channels: in the group's last block, warp w
// adds channel c0 + w's parts, rung 04's merge. apply is rung 04's. (At 49 windows, lanes 17 to 31 idle on each image's
// second pass.) What it leaves: the product keeps two images' loads in flight per warp (BN_REDUCE_IMAGES) where this
// loop waits for each load in turn, and its apply takes a thread per 2 x 2 window, which reads the window's gradient
// and position once and writes its four elements as two float2 (S even).
//
// Launch (dev/ladder/bn_backward/op.py, launch_warp_per_channel): reduce: grid (parts, ceil(C / CHANNELS)), blocks
// of 32 x CHANNELS threads; apply: a thread per element of x, blocks of 256. CHANNELS, NO_POSITION, MAX_PARTS and
// MAX_CHANNELS come from there as -D options; the scratch, part_sums and blocks_done, is this module's own memory,
// sized from them.
#if !defined(CHANNELS) || !defined(NO_POSITION) || !defined(MAX_PARTS) || !defined(MAX_CHANNELS)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
#define THREADS (32 * CHANNELS)

__device__ float part_sums[MAX_CHANNELS * MAX_PARTS * 2];  // [C, parts, 2]: (sum dz, sum dz xhat) of each part
__device__ unsigned int blocks_done[MAX_CHANNELS] = {};    // per group of CHANNELS channels: blocks done

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Warp w of block (part, group): the windows of images [part * imgs_per_part, min(N, (part + 1) * imgs_per_part))
// in channel group * CHANNELS + w.
extern "C" __global__ void __launch_bounds__(THREADS)
    bn_backward_rung05_warp_per_channel_reduce(const float* x_at, const float* mean, const float* invstd,
                                               const float* d_pooled, const unsigned char* position, int N, int C,
                                               int S, int imgs_per_part, float* dgamma, float* dbeta) {
    __shared__ bool last;
    const int lane = threadIdx.x % 32, part = blockIdx.x, parts = gridDim.x, windows = (S / 2) * (S / 2);
    const int c = blockIdx.y * CHANNELS + threadIdx.x / 32;  // this warp's channel
    if (c < C) {                                             // (the whole warp: a warp's lanes share c)
        const float m = mean[c], is = invstd[c];
        float sdz = 0.0f, sdzx = 0.0f;
        for (int n = part * imgs_per_part; n < min(N, (part + 1) * imgs_per_part); n++)
            for (int t = lane; t < windows; t += 32) {
                const size_t window = (size_t)(n * C + c) * windows + t;
                const float g = d_pooled[window], xa = x_at[window];  // (loaded whatever the position says)
                if (position[window] != NO_POSITION) {
                    sdz += g;
                    sdzx += g * (xa - m) * is;
                }
            }
        sdz = warp_sum(sdz);
        sdzx = warp_sum(sdzx);
        if (lane == 0) {
            part_sums[((size_t)c * parts + part) * 2] = sdz;
            part_sums[((size_t)c * parts + part) * 2 + 1] = sdzx;
        }
    }

    __threadfence();  // the pairs are visible device-wide before the count says so
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&blocks_done[blockIdx.y], 1u) == parts - 1;
        if (last) blocks_done[blockIdx.y] = 0u;  // every block of the group has counted: ready for the next launch
    }
    __syncthreads();
    if (!last || c >= C) return;  // (no barrier follows)
    __threadfence();

    // The group's last block: warp w adds channel c's parts in order (lane l takes parts l, l + 32, ...), from L2.
    const float* sums = part_sums + (size_t)c * parts * 2;
    float db = 0.0f, dg = 0.0f;
    for (int b = lane; b < parts; b += 32) {
        db += __ldcg(sums + 2 * b);
        dg += __ldcg(sums + 2 * b + 1);
    }
    db = warp_sum(db);
    dg = warp_sum(dg);
    if (lane == 0) {
        dbeta[c] = db;
        dgamma[c] = dg;
    }
}

// A thread per element of x [N,C,S,S]; dbeta and dgamma from reduce.
extern "C" __global__ void bn_backward_rung05_warp_per_channel_apply(
    const float* x, const float* mean, const float* invstd, const float* gamma, const float* dgamma, const float* dbeta,
    const float* d_pooled, const unsigned char* position, int N, int C, int S, float* dx) {
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
