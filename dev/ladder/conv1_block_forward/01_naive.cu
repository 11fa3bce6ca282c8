// Rung 01, naive: the product's naive kernels chained, one thread per element (a block per channel for the
// statistics), every intermediate tensor written to global memory and read back.
//   x [N,1,28,28] bytes -> xn = (x/255 - MNIST_MEAN)/MNIST_STD -> a = conv1(xn, w [K,1,3,3]) [N,K,28,28]
//   -> mean, invstd = 1/sqrt(var + eps) of a per channel over the batch -> z = (a - mean) invstd gamma + beta
//   -> r = relu(z) -> pooled [N,K,14,14], argmax = 2x2 max-pool of r (the first maximum wins)
//
// These are the product's naive kernels, normalize_naive (kernels/naive/1_normalize.cu), conv2d_forward_naive
// (2_conv2d.cu), batchnorm_stats_naive and batchnorm_apply_naive (3_batchnorm.cu), relu_forward_naive (4_relu.cu) and
// maxpool2x2_forward_naive (5_maxpool.cu), copied verbatim in the order the naive step launches them, with the
// helpers of kernels/include/common.cuh they call, so that the file stands alone (tests/test_ladder.py keeps the
// kernels the same as the product's). It is the yardstick every later rung is checked and timed against. What it
// leaves on the table: conv1's output a, BatchNorm's z and ReLU's r are 100 KB per image each, written once and
// read back; the statistics read a twice with 32 blocks in all and a strided gather; and a costs 9 multiply-adds
// per value, far less than moving it.
//
// Launch (dev/ladder/conv1_block_forward/op.py, launch_naive): each kernel as mnist_cuda/ops/naive.py launches it,
// one thread per element in blocks of 256, the statistics a block of 256 threads per channel.
#if !defined(MNIST_MEAN) || !defined(MNIST_STD)
#error "compile through dev/ladder.py, which passes the data's constants as -D options"
#endif

// ---- the helpers of kernels/include/common.cuh that the kernels call ----
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float normalize_pixel(unsigned char v) {
    return ((float)v / 255.0f - MNIST_MEAN) / MNIST_STD;
}

__device__ __forceinline__ float batchnorm_apply(float x, float mean, float invstd, float gamma, float beta) {
    return (x - mean) * invstd * gamma + beta;
}

__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

// ---- the kernels, in the order of the step ----

extern "C" __global__ void normalize_naive(const unsigned char* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = normalize_pixel(x[i]);
}

extern "C" __global__ void conv2d_forward_naive(const float* x, const float* w, float* y, int N, int C, int K, int H,
                                                int W) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * K * H * W) return;
    int ow = idx % W, oh = (idx / W) % H, k = (idx / (W * H)) % K, n = idx / (W * H * K);
    float acc = 0.0f;
    for (int c = 0; c < C; c++)
        for (int i = 0; i < 3; i++) {
            int ih = oh + i - 1;
            if (ih < 0 || ih >= H) continue;
            for (int j = 0; j < 3; j++) {
                int iw = ow + j - 1;
                if (iw < 0 || iw >= W) continue;
                acc += x[((n * C + c) * H + ih) * W + iw] * w[((k * C + c) * 3 + i) * 3 + j];
            }
        }
    y[idx] = acc;
}

extern "C" __global__ void batchnorm_stats_naive(const float* x, float* mean, float* invstd, float* running_mean,
                                                 float* running_var, int N, int C, int HW, float eps, float momentum) {
    const int c = blockIdx.x, count = N * HW;
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += x[((i / HW) * C + c) * HW + i % HW];
    const float m = block_sum(s) / count;
    float q = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        float d = x[((i / HW) * C + c) * HW + i % HW] - m;
        q += d * d;
    }
    const float var = block_sum(q) / count;
    if (threadIdx.x == 0) {
        mean[c] = m;
        invstd[c] = rsqrtf(var + eps);
        float unbiased = count > 1 ? var * count / (count - 1) : var;
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
        running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
}

extern "C" __global__ void batchnorm_apply_naive(const float* x, const float* mean, const float* invstd,
                                                 const float* gamma, const float* beta, float* y, int N, int C,
                                                 int HW) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * HW) return;
    int c = (idx / HW) % C;
    y[idx] = batchnorm_apply(x[idx], mean[c], invstd[c], gamma[c], beta[c]);
}

extern "C" __global__ void relu_forward_naive(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu(x[i]);
}

extern "C" __global__ void maxpool2x2_forward_naive(const float* x, float* y, unsigned char* argmax, int N, int C,
                                                    int H, int W) {
    const int Ho = H / 2, Wo = W / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * Ho * Wo) return;
    int ow = idx % Wo, oh = (idx / Wo) % Ho, nc = idx / (Wo * Ho);
    const float* window = x + (nc * H + 2 * oh) * W + 2 * ow;
    float best = window[0];
    int best_at = 0;
    for (int p = 1; p < 4; p++) {
        float v = window[(p / 2) * W + p % 2];
        if (v > best || isnan(v)) {
            best = v;
            best_at = p;
        }  // strict '>': the first maximum wins
        if (isnan(best)) break;  // NaN propagates, as in PyTorch
    }
    y[idx] = best;
    argmax[idx] = (unsigned char)best_at;
}
