// Rung 03, bn_relu_pool: BatchNorm's apply, the ReLU and the max-pool fused into one kernel, a thread per pooled
// output, which reads its window of conv1's output once and writes only the pooled value and its position.
//   x [N,1,28,28] bytes -> xn = (x/255 - MNIST_MEAN)/MNIST_STD -> a = conv1(xn, w [K,1,3,3]) [N,K,28,28]
//   -> mean, invstd = 1/sqrt(var + eps) of a per channel over the batch -> z = (a - mean) invstd gamma + beta
//   -> r = relu(z) -> pooled [N,K,14,14], argmax = 2x2 max-pool of r (the first maximum wins)
//
// What it adds over rung 02: in rung 02 the three elementwise steps after the statistics each read a full tensor
// and the first two write one (a read, z written and read, r written and read). Here a thread reads the four
// values of a under its pooled window, normalises them with its channel's mean, invstd, gamma and beta, applies
// the ReLU and takes the maximum in registers: z and r never exist, and of the block's output only pooled and
// argmax (a quarter of a's size, and a byte each) are written. The convolution and the statistics are rung 02's.
// What it leaves: a itself, 100 KB per image, is still written by the convolution and read back by the pool,
// while each of its values costs only 9 multiply-adds to compute from a 3 KB image (rung 04).
//
// Launch (dev/ladder/conv1_block_forward/op.py, launch_bn_relu_pool): conv_stats grid (N, ceil(K / CHANNELS)),
// block THREADS; stats grid K, block THREADS; bn_relu_pool a thread per pooled output, blocks of 256. The sizes
// come as -D options; the shared memory is sized here.
#if !defined(THREADS) || !defined(CHANNELS) || !defined(MNIST_MEAN) || !defined(MNIST_STD)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(THREADS % 32 == 0 && THREADS >= 2 * CHANNELS, "whole warps, and a thread per channel and sum");
#define S 28            // conv1's image and output size
#define P (S + 2)       // the image zero-padded
#define PIXELS (S * S)  // outputs per image and channel

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float normalize_pixel(unsigned char v) {
    return ((float)v / 255.0f - MNIST_MEAN) / MNIST_STD;
}
__device__ __forceinline__ float batchnorm_apply(float x, float mean, float invstd, float gamma, float beta) {
    return (x - mean) * invstd * gamma + beta;
}
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

// a [N,K,28,28] of image n = blockIdx.x, channels k0 = blockIdx.y * CHANNELS ..; partial [K, N, 2]: the block's
// sum of a and of a^2 per channel
extern "C" __global__ void __launch_bounds__(THREADS)
    conv1_block_forward_rung03_conv_stats(const unsigned char* x, const float* w, int N, int K, float* a,
                                          double* partial) {
    __shared__ float img[P * P];       // image n normalised, zero-padded
    __shared__ float ws[CHANNELS][9];  // the weights of channels k0 ..
    __shared__ double red[THREADS / 32][CHANNELS][2];
    const int n = blockIdx.x, k0 = blockIdx.y * CHANNELS, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int i = threadIdx.x; i < P * P; i += THREADS) {
        const int r = i / P - 1, c = i % P - 1;
        img[i] = r >= 0 && r < S && c >= 0 && c < S ? normalize_pixel(x[(size_t)n * PIXELS + r * S + c]) : 0.0f;
    }
    for (int i = threadIdx.x; i < CHANNELS * 9; i += THREADS)
        ws[i / 9][i % 9] = k0 + i / 9 < K ? w[(k0 + i / 9) * 9 + i % 9] : 0.0f;
    __syncthreads();

    double sum[CHANNELS] = {}, squares[CHANNELS] = {};
    for (int p = threadIdx.x; p < PIXELS; p += THREADS) {
        float patch[9];  // the 3x3 input under output pixel p (padded rows p / S .., columns p % S ..)
#pragma unroll
        for (int t = 0; t < 9; t++) patch[t] = img[(p / S + t / 3) * P + p % S + t % 3];
#pragma unroll
        for (int kk = 0; kk < CHANNELS; kk++) {
            float v = 0.0f;
#pragma unroll
            for (int t = 0; t < 9; t++) v = fmaf(patch[t], ws[kk][t], v);
            if (k0 + kk >= K) continue;
            a[((size_t)n * K + k0 + kk) * PIXELS + p] = v;
            sum[kk] += v;
            squares[kk] += (double)v * v;
        }
    }
    // the block's sums: each warp's, then the warps in order
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
    partial[((size_t)(k0 + kk) * gridDim.x + n) * 2 + which] = total;
}

// Channel c = blockIdx.x: its parts' sums merged in order (partial [K, parts, 2]), its mean and invstd saved and
// the running statistics updated (as the product's batchnorm_finalize does)
extern "C" __global__ void __launch_bounds__(THREADS)
    conv1_block_forward_rung03_stats(const double* partial, int parts, int N, float eps, float momentum, float* mean,
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

// pooled[n,k,ph,pw] = max of relu(bn(a)) over the window (2ph.., 2pw..), argmax its position 0..3 (the first
// maximum wins; a NaN wins and stays): a thread per pooled output i
extern "C" __global__ void conv1_block_forward_rung03_bn_relu_pool(const float* a, const float* mean,
                                                                   const float* invstd, const float* gamma,
                                                                   const float* beta, int N, int K, float* pooled,
                                                                   unsigned char* argmax) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = i % (PIXELS / 4), k = i / (PIXELS / 4) % K;
    if (i >= N * K * (PIXELS / 4)) return;
    const float* window = a + (size_t)(i / (PIXELS / 4)) * PIXELS + 2 * (t / (S / 2)) * S + 2 * (t % (S / 2));
    const float m = mean[k], is = invstd[k], g = gamma[k], b = beta[k];
    float best = relu(batchnorm_apply(window[0], m, is, g, b));
    int best_at = 0;
    for (int p = 1; p < 4 && !isnan(best); p++) {
        const float v = relu(batchnorm_apply(window[(p / 2) * S + p % 2], m, is, g, b));
        if (v > best || isnan(v)) best = v, best_at = p;
    }
    pooled[i] = best;
    argmax[i] = (unsigned char)best_at;
}
