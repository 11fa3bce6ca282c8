// 2_conv2d.cu: 3x3 convolution, stride 1, zero padding 1, no bias, NCHW.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]
//
// naive: one thread per output element, loops straight from the definition.
#include "common.cuh"


// y[n,k,h,w] = sum_{c,i,j} x[n,c,h+i-1,w+j-1] * w[k,c,i,j]
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

// dx[n,c,h,w] = sum_{k,i,j} dy[n,k,h+1-i,w+1-j] * w[k,c,i,j]   (each input pixel feeds 9 outputs)
extern "C" __global__ void conv2d_backward_input_naive(const float* dy, const float* w, float* dx, int N, int C, int K,
                                                       int H, int W) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * H * W) return;
    int iw = idx % W, ih = (idx / W) % H, c = (idx / (W * H)) % C, n = idx / (W * H * C);
    float acc = 0.0f;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 3; i++) {
            int oh = ih + 1 - i;
            if (oh < 0 || oh >= H) continue;
            for (int j = 0; j < 3; j++) {
                int ow = iw + 1 - j;
                if (ow < 0 || ow >= W) continue;
                acc += dy[((n * K + k) * H + oh) * W + ow] * w[((k * C + c) * 3 + i) * 3 + j];
            }
        }
    dx[idx] = acc;
}

// dw[k,c,i,j] = sum_{n,h,w} dy[n,k,h,w] * x[n,c,h+i-1,w+j-1]   (one thread per weight)
extern "C" __global__ void conv2d_backward_weight_naive(const float* x, const float* dy, float* dw, int N, int C, int K,
                                                        int H, int W) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= K * C * 9) return;
    int j = idx % 3, i = (idx / 3) % 3, c = (idx / 9) % C, k = idx / (9 * C);
    float acc = 0.0f;
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < H; oh++) {
            int ih = oh + i - 1;
            if (ih < 0 || ih >= H) continue;
            for (int ow = 0; ow < W; ow++) {
                int iw = ow + j - 1;
                if (iw < 0 || iw >= W) continue;
                acc += dy[((n * K + k) * H + oh) * W + ow] * x[((n * C + c) * H + ih) * W + iw];
            }
        }
    dw[idx] = acc;
}
