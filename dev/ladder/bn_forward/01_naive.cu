// Rung 01, naive: the product's naive forward of BN2 + ReLU + max pool, three kernels that each read and write
// full [N,C,S,S] tensors: BatchNorm's apply with the batch's statistics, the ReLU in place, and the 2x2 max pool
// with its argmax.
//   z[n,c,h,w] = relu((x[n,c,h,w] - mean[c]) invstd[c] gamma[c] + beta[c]);
//   pooled[n,c,i,j] = max of z over the window (2i..2i+1, 2j..2j+1), argmax its position 0..3
//
// These are the product's naive kernels, batchnorm_apply_naive of kernels/naive/3_batchnorm.cu, relu_forward_naive
// of kernels/naive/4_relu.cu and maxpool2x2_forward_naive of kernels/naive/5_maxpool.cu, copied verbatim so that the
// ladder's files stand alone (tests/test_ladder.py keeps them the same), with the two helpers they call from
// kernels/include/common.cuh. They are the yardstick every later rung is checked and timed against. What they leave
// on the table: the full-size z written by the apply, read and written again by the ReLU and read by the pool (x's
// bytes four times over besides x itself), for a result a quarter of x; the backward then reads z in full for the
// ReLU's mask and the argmax for the pool's.
//
// Launch (dev/ladder/bn_forward/op.py, launch_naive): a thread per element of x for the apply and the ReLU, a thread
// per pooled pixel for the pool, blocks of 256; z and argmax are the op's scratch.

__device__ __forceinline__ float batchnorm_apply(float x, float mean, float invstd, float gamma, float beta) {
    return (x - mean) * invstd * gamma + beta;
}

__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }

// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]; training passes the batch statistics.
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
