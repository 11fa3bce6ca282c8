// Rung 02, fused: one kernel, a block per channel, that takes BatchNorm's sums over the pooled windows and then
// writes dx, with the pool's and the ReLU's backward folded in: dz is rebuilt where it is needed, never stored.
//   dz[n,c,h,w] = d_pooled[n,c,h/2,w/2] where position[n,c,h/2,w/2] names (h,w) in its window, else 0
//   (position: the window's argmax, or NO_POSITION where the ReLU blocked the window);
//   dbeta[c] = sum dz, dgamma[c] = sum dz xhat, xhat = (x - mean[c]) invstd[c] (sums over N x S x S = count);
//   dx = gamma[c] invstd[c] / count (count dz - dbeta[c] - xhat dgamma[c])
//
// What it adds over rung 01: no intermediate tensors. dz is nonzero at one element of each window at most, the
// argmax, and there only if the ReLU passed: the forward's position byte says both (NO_POSITION where the pooled
// value is not positive), so the ReLU's output is not read at all. The sums then run over the N x S/2 x S/2 windows
// of the channel, not its N x S x S elements: where the position is not NO_POSITION, the window's gradient and x
// at the position. The second pass writes dx over every element, dz taken from its window's gradient where the
// window's position is the element's. Of full-size tensors, where rung 01 writes three and reads six, this
// writes dx and reads x (once in full, and gathered at the positions for the sums). What it leaves: rung 01's C blocks,
// each alone with a channel of the batch, one load latency after another; dx's pass, which needs no reduction, waits
// inside the same block for the sums (rung 03).
//
// Launch (dev/ladder/bn_backward/op.py, launch_fused): grid C, blocks of THREADS threads. THREADS and NO_POSITION
// (mnist_cuda/ops/common.py's) come from there as -D options.
#if !defined(THREADS) || !defined(NO_POSITION)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

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

extern "C" __global__ void __launch_bounds__(THREADS)
    bn_backward_rung02_fused(const float* x, const float* mean, const float* invstd, const float* gamma,
                             const float* d_pooled, const unsigned char* position, int N, int C, int S, float* dx,
                             float* dgamma, float* dbeta) {
    const int c = blockIdx.x, So = S / 2, windows = So * So, pixels = S * S;
    const float m = mean[c], is = invstd[c], count = (float)N * pixels;

    // dbeta and dgamma over the channel's windows where the ReLU passed (an odd S's last row and column are in
    // no window: their dz is zero)
    float sdz = 0.0f, sdzx = 0.0f;
    for (int i = threadIdx.x; i < N * windows; i += THREADS) {
        const int n = i / windows, t = i % windows;
        const size_t window = (size_t)(n * C + c) * windows + t;
        const int at = position[window];
        if (at != NO_POSITION) {
            const int h = 2 * (t / So) + at / 2, w = 2 * (t % So) + at % 2;
            const float g = d_pooled[window];
            sdz += g;
            sdzx += g * (x[(size_t)(n * C + c) * pixels + h * S + w] - m) * is;
        }
    }
    const float db = block_sum(sdz), dg = block_sum(sdzx);
    if (threadIdx.x == 0) {
        dbeta[c] = db;
        dgamma[c] = dg;
    }

    // dx over every element of the channel
    const float k = gamma[c] * is / count;
    for (int i = threadIdx.x; i < N * pixels; i += THREADS) {
        const int n = i / pixels, h = i % pixels / S, w = i % S;
        const size_t at = (size_t)(n * C + c) * pixels + i % pixels;
        float dz = 0.0f;
        if (h / 2 < So && w / 2 < So) {
            const size_t window = (size_t)(n * C + c) * windows + (h / 2) * So + w / 2;
            if (position[window] == (h % 2) * 2 + w % 2) dz = d_pooled[window];
        }
        dx[at] = k * (count * dz - db - (x[at] - m) * is * dg);
    }
}
