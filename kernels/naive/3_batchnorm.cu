// 3_batchnorm.cu: BatchNorm2d as PyTorch defines it, over x [N,C,H,W], per channel c.
//   training: mean and biased variance of the batch; running stats updated with the unbiased
//             variance and momentum; eval: the running statistics.
//
// naive: one block per channel for the reductions (fixed order: deterministic), one thread per
// element for the elementwise parts.
#include "common.cuh"


// Per channel: mean, invstd = 1/sqrt(var + eps), and the running-statistics update. Two passes
// over the channel (mean first, then squared deviations) for an accurate variance.
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

// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]; training passes the batch statistics.
extern "C" __global__ void batchnorm_apply_naive(const float* x, const float* mean, const float* invstd,
                                                 const float* gamma, const float* beta, float* y, int N, int C,
                                                 int HW) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * HW) return;
    int c = (idx / HW) % C;
    y[idx] = batchnorm_apply(x[idx], mean[c], invstd[c], gamma[c], beta[c]);
}

// Evaluation: the same with the running statistics.
extern "C" __global__ void batchnorm_eval_naive(const float* x, const float* running_mean, const float* running_var,
                                                const float* gamma, const float* beta, float* y, int N, int C, int HW,
                                                float eps) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * HW) return;
    int c = (idx / HW) % C;
    y[idx] = batchnorm_apply(x[idx], running_mean[c], rsqrtf(running_var[c] + eps), gamma[c], beta[c]);
}

// Backward through the batch statistics, one block per channel:
//   dbeta = sum dy, dgamma = sum dy*xhat,
//   dx = gamma*invstd/count * (count*dy - dbeta - xhat*dgamma),  xhat = (x - mean)*invstd.
extern "C" __global__ void batchnorm_backward_naive(const float* dy, const float* x, const float* mean,
                                                    const float* invstd, const float* gamma, float* dx, float* dgamma,
                                                    float* dbeta, int N, int C, int HW) {
    const int c = blockIdx.x, count = N * HW;
    const float m = mean[c], is = invstd[c];
    float sdy = 0.0f, sdyx = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int at = ((i / HW) * C + c) * HW + i % HW;
        sdy += dy[at];
        sdyx += dy[at] * (x[at] - m) * is;
    }
    const float db = block_sum(sdy), dg = block_sum(sdyx);
    if (threadIdx.x == 0) {
        dbeta[c] = db;
        dgamma[c] = dg;
    }
    const float scale = gamma[c] * is / count;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int at = ((i / HW) * C + c) * HW + i % HW;
        dx[at] = scale * (count * dy[at] - db - (x[at] - m) * is * dg);
    }
}
