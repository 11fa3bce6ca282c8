// 5_maxpool.cu: 2x2 max pooling, stride 2 (floor: an odd last row/column is dropped, as in PyTorch).
//   x [N,C,H,W] -> y [N,C,H/2,W/2] and argmax (0..3 = window position (0,0),(0,1),(1,0),(1,1))
//
// naive: one thread per output (forward) and one per input element (backward, a gather: no atomics).
#include "common.cuh"


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

// dx[n,c,h,w] = dy of its window if (h,w) was that window's argmax, else 0.
extern "C" __global__ void maxpool2x2_backward_naive(const float* dy, const unsigned char* argmax, float* dx, int N,
                                                     int C, int H, int W) {
    const int Ho = H / 2, Wo = W / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * H * W) return;
    int iw = idx % W, ih = (idx / W) % H, nc = idx / (W * H);
    int oh = ih / 2, ow = iw / 2;
    float g = 0.0f;
    if (oh < Ho && ow < Wo) {
        int out = (nc * Ho + oh) * Wo + ow;
        if (argmax[out] == (ih % 2) * 2 + iw % 2) g = dy[out];
    }
    dx[idx] = g;
}
