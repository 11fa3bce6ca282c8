// Rung 04, recompute: conv1's output is never stored: a first pass computes it and keeps only its sums, and the
// forward computes it again from the staged image, window by window, and pools it in registers.
//   x [N,1,28,28] bytes -> xn = (x/255 - MNIST_MEAN)/MNIST_STD -> a = conv1(xn, w [K,1,3,3]) [N,K,28,28]
//   -> mean, invstd = 1/sqrt(var + eps) of a per channel over the batch -> z = (a - mean) invstd gamma + beta
//   -> r = relu(z) -> pooled [N,K,14,14], argmax = 2x2 max-pool of r (the first maximum wins)
//
// What it adds over rung 03: a is 100 KB per image, written and read back in rung 03, while its image is 784 bytes
// and a value of a costs 9 multiply-adds. So a is not stored. The sums kernel convolves as rung 03's conv_stats
// does but keeps only the sums, a block taking a part of the batch (imgs_per_block images in turn) so that few
// pairs are left to merge. The forward stages its image again; a thread per pooled window copies the 4x4 input
// patch under it into registers (16 shared loads), computes the window's four outputs for each of the block's
// channels (36 multiply-adds each), normalises, applies the ReLU and pools. The bytes are read twice; only pooled
// and argmax are written. What it leaves: the sums pass convolves the whole batch for every channel on the
// forward's path, though the sums depend on the images through 54 numbers alone (rung 05).
//
// Launch (dev/ladder/conv1_block_forward/op.py, launch_recompute): sums grid (parts, ceil(K / CHANNELS)), block
// THREADS; stats grid K, block THREADS; forward grid (N, ceil(K / CHANNELS)), block WINDOW_THREADS (-D options).
#if !defined(THREADS) || !defined(WINDOW_THREADS) || !defined(CHANNELS) || !defined(MNIST_MEAN) || !defined(MNIST_STD)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS >= 2 * CHANNELS && WINDOW_THREADS % 32 == 0, "whole warps");
#define S 28            // conv1's image and output size
#define P (S + 2)       // the image zero-padded
#define PIXELS (S * S)  // outputs per image and channel
#define WINDOWS (PIXELS / 4)

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }
__device__ __forceinline__ float normalize_pixel(unsigned char v) {
    return ((float)v / 255.0f - MNIST_MEAN) / MNIST_STD;
}
// image n of x into img, normalised and zero-padded, by the block's `threads` threads
__device__ __forceinline__ void stage_image(const unsigned char* x, int n, int threads, float* img) {
    for (int i = threadIdx.x; i < P * P; i += threads) {
        const int r = i / P - 1, c = i % P - 1;
        img[i] = r >= 0 && r < S && c >= 0 && c < S ? normalize_pixel(x[(size_t)n * PIXELS + r * S + c]) : 0.0f;
    }
}

// The sums of a and a^2 per channel over images first .. last - 1 (blockIdx.x * imgs_per_block ..), channels
// k0 = blockIdx.y * CHANNELS ..: partial [K, parts, 2]
extern "C" __global__ void __launch_bounds__(THREADS)
    conv1_block_forward_rung04_sums(const unsigned char* x, const float* w, int N, int K, int imgs_per_block,
                                    double* partial) {
    __shared__ float img[P * P];
    __shared__ float ws[CHANNELS][9];
    __shared__ double red[THREADS / 32][CHANNELS][2];
    const int k0 = blockIdx.y * CHANNELS, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int first = blockIdx.x * imgs_per_block, last = min(N, first + imgs_per_block);
    for (int i = threadIdx.x; i < CHANNELS * 9; i += THREADS)
        ws[i / 9][i % 9] = k0 + i / 9 < K ? w[(k0 + i / 9) * 9 + i % 9] : 0.0f;
    double sum[CHANNELS] = {}, squares[CHANNELS] = {};
    for (int n = first; n < last; n++) {
        __syncthreads();  // every thread is done with the previous image (and the weights are staged)
        stage_image(x, n, THREADS, img);
        __syncthreads();
        for (int p = threadIdx.x; p < PIXELS; p += THREADS) {
            float patch[9];
#pragma unroll
            for (int t = 0; t < 9; t++) patch[t] = img[(p / S + t / 3) * P + p % S + t % 3];
#pragma unroll
            for (int kk = 0; kk < CHANNELS; kk++) {
                float v = 0.0f;
#pragma unroll
                for (int t = 0; t < 9; t++) v = fmaf(patch[t], ws[kk][t], v);
                sum[kk] += v;  // (zero weights past K: those sums are not written)
                squares[kk] += (double)v * v;
            }
        }
    }
#pragma unroll
    for (int kk = 0; kk < CHANNELS; kk++) {
        const double s = warp_sum(sum[kk]), q = warp_sum(squares[kk]);
        if (lane == 0) red[warp][kk][0] = s, red[warp][kk][1] = q;
    }
    __syncthreads();
    const int kk = threadIdx.x / 2, which = threadIdx.x % 2;
    if (threadIdx.x >= 2 * CHANNELS || k0 + kk >= K) return;
    double total = 0.0;
    for (int i = 0; i < THREADS / 32; i++) total += red[i][kk][which];
    partial[((size_t)(k0 + kk) * gridDim.x + blockIdx.x) * 2 + which] = total;
}

// Channel c = blockIdx.x: rung 03's stats (partial [K, parts, 2] merged in order; mean, invstd, running statistics)
extern "C" __global__ void __launch_bounds__(THREADS)
    conv1_block_forward_rung04_stats(const double* partial, int parts, int N, float eps, float momentum, float* mean,
                                     float* invstd, float* running_mean, float* running_var) {
    __shared__ double red[THREADS / 32][2];
    const int c = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double s = 0.0, q = 0.0;
    for (int i = threadIdx.x; i < parts; i += THREADS) {
        s += partial[((size_t)c * parts + i) * 2];
        q += partial[((size_t)c * parts + i) * 2 + 1];
    }
    s = warp_sum(s), q = warp_sum(q);
    if (lane == 0) red[warp][0] = s, red[warp][1] = q;
    __syncthreads();
    if (threadIdx.x != 0) return;
    s = q = 0.0;
    for (int i = 0; i < THREADS / 32; i++) s += red[i][0], q += red[i][1];
    const double count = (double)N * PIXELS, m = s / count;
    const float var = (float)fmax(q / count - m * m, 0.0), cnt = (float)count;
    mean[c] = (float)m;
    invstd[c] = rsqrtf(var + eps);
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * (float)m;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (cnt > 1.0f ? var * cnt / (cnt - 1.0f) : var);
}

// pooled, argmax [N,K,14,14] of image n = blockIdx.x, channels k0 = blockIdx.y * CHANNELS ..: a thread per window
extern "C" __global__ void __launch_bounds__(WINDOW_THREADS)
    conv1_block_forward_rung04_forward(const unsigned char* x, const float* w, const float* mean, const float* invstd,
                                       const float* gamma, const float* beta, int N, int K, float* pooled,
                                       unsigned char* argmax) {
    __shared__ float img[P * P];
    __shared__ float ws[CHANNELS][9];
    const int n = blockIdx.x, k0 = blockIdx.y * CHANNELS, channels = min(CHANNELS, K - k0);
    stage_image(x, n, WINDOW_THREADS, img);
    for (int i = threadIdx.x; i < CHANNELS * 9; i += WINDOW_THREADS)
        ws[i / 9][i % 9] = i / 9 < channels ? w[(k0 + i / 9) * 9 + i % 9] : 0.0f;
    __syncthreads();
    for (int t = threadIdx.x; t < WINDOWS; t += WINDOW_THREADS) {
        float p[4][4];  // the input under window t: padded rows 2 * (t / 14) .. + 3, columns 2 * (t % 14) .. + 3
#pragma unroll
        for (int i = 0; i < 16; i++) p[i / 4][i % 4] = img[(2 * (t / (S / 2)) + i / 4) * P + 2 * (t % (S / 2)) + i % 4];
        for (int k = k0; k < k0 + channels; k++) {
            const float m = mean[k], is = invstd[k], g = gamma[k], b = beta[k];
            float z[4];  // BatchNorm's output at the window's four pixels (0,0), (0,1), (1,0), (1,1)
#pragma unroll
            for (int pos = 0; pos < 4; pos++) {
                float v = 0.0f;
#pragma unroll
                for (int tap = 0; tap < 9; tap++) v = fmaf(p[pos / 2 + tap / 3][pos % 2 + tap % 3], ws[k - k0][tap], v);
                z[pos] = (v - m) * is * g + b;  // as batchnorm_apply
            }
            float best = relu(z[0]);
            int best_at = 0;
            for (int pos = 1; pos < 4 && !isnan(best); pos++)  // the first maximum wins; a NaN wins and stays
                if (relu(z[pos]) > best || isnan(z[pos])) best = relu(z[pos]), best_at = pos;
            const size_t at = ((size_t)n * K + k) * WINDOWS + t;
            pooled[at] = best;
            argmax[at] = (unsigned char)best_at;
        }
    }
}
