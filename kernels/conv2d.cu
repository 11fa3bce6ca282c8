// conv2d.cu: 3x3 convolution, stride 1, zero padding 1, no bias, NCHW.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]
//
// naive: one thread per output element, loops straight from the definition.
#include "common.cuh"

// y[n,k,h,w] = sum_{c,i,j} x[n,c,h+i-1,w+j-1] * w[k,c,i,j]
extern "C" __global__ void conv2d_forward_naive(const float* x, const float* w, float* y,
                                                int N, int C, int K, int H, int W) {
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
extern "C" __global__ void conv2d_backward_input_naive(const float* dy, const float* w, float* dx,
                                                       int N, int C, int K, int H, int W) {
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
extern "C" __global__ void conv2d_backward_weight_naive(const float* x, const float* dy, float* dw,
                                                        int N, int C, int K, int H, int W) {
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

// ---------------------------------------------------------------------------------------------------
// fast: implicit GEMM on the shared tiled core (gemm.cuh). The spatial size is a compile-time constant
// (14: conv2's) so the index arithmetic is multiplies and shifts, not divisions.
#include "gemm.cuh"

#define CONV2_SIZE 14

// Forward as C[k][q] = sum_{c,tap} w[k, c*9+tap] * im2col(x)[c*9+tap, q], q = a pixel of some image.
template <int S>
__device__ void conv2d_forward_tiled(const float* x, const float* w, float* y, int N, int C, int K) {
    const int npix = N * S * S, m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    float acc[4][4];
    gemm_tile<TILE_M, TILE_N, true, true>(Dense{w, K, C * 9, C * 9, 1}, Im2col<S, false>{x, C, npix}, m0, n0, 0,
                                          C * 9, acc);
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int k, int q, float v) {
        if (k < K && q < npix) y[((q / (S * S)) * K + k) * (S * S) + q % (S * S)] = v;
    });
}

// w [K, C, 3, 3] as seen from input channel c: line c, element k*9 + tap is w[k, c, tap].
struct WeightsByInput {
    const float* w;
    int C, K;
    struct Line {
        const float* p;
        bool valid;
    };
    __device__ Line line(int c) const { return {w + (c < C ? c * 9 : 0), c < C}; }
    __device__ float at(const Line& l, int kk) const {
        return (l.valid && kk < K * 9) ? l.p[(kk / 9) * C * 9 + kk % 9] : 0.0f;
    }
};

// Input gradient as C[c][q] = sum_{k,tap} w[k, c, tap] * im2col_flipped(dy)[k*9+tap, q]. C has only
// C_in (32) rows, so the tile is 32 x 128: a 64-row tile would leave half its threads idle. At small
// batches there are fewer tiles than SMs, so the k range is cut into gridDim.z splits (partial
// results summed by splitk_reduce), as for the weight gradient.
#define DGRAD_TILE_M 32
#define DGRAD_TILE_N 128
template <int S>
__device__ void conv2d_backward_input_tiled(const float* dy, const float* w, float* partial, int N, int C, int K,
                                            int k_per_split) {
    const int npix = N * S * S, m0 = blockIdx.y * DGRAD_TILE_M, n0 = blockIdx.x * DGRAD_TILE_N;
    int k_begin, k_end;
    split_range(blockIdx.z, k_per_split, K * 9, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<DGRAD_TILE_M, DGRAD_TILE_N, true, true>(WeightsByInput{w, C, K}, Im2col<S, true>{dy, K, npix}, m0,
                                                      n0, k_begin, k_end, acc);
    float* out = partial + (size_t)blockIdx.z * N * C * S * S;
    gemm_store<DGRAD_TILE_M, DGRAD_TILE_N>(acc, m0, n0, [&](int c, int q, float v) {
        if (c < C && q < npix) out[((q / (S * S)) * C + c) * (S * S) + q % (S * S)] = v;
    });
}

// y [N, K, S, S] by channel: line k, element q = n*S*S + p (a pixel of the batch) is y[n, k, p].
template <int S>
struct PixelsOfChannel {
    const float* y;
    int K, npix;
    struct Line {
        const float* p;
        bool valid;
    };
    __device__ Line line(int k) const { return {y + (k < K ? k * S * S : 0), k < K}; }
    __device__ float at(const Line& l, int q) const {
        return (l.valid && q < npix) ? l.p[(q / (S * S)) * K * S * S + q % (S * S)] : 0.0f;
    }
};

// Weight gradient as C[k][c*9+tap] = sum_q dy[k, q] * im2col(x)[c*9+tap, q]: a reduction over every
// pixel of the batch, cut into gridDim.z splits (one partial result each, summed by splitk_reduce).
template <int S>
__device__ void conv2d_backward_weight_tiled(const float* x, const float* dy, float* partial, int N, int C,
                                             int K, int k_per_split) {
    const int npix = N * S * S, m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    int k_begin, k_end;
    split_range(blockIdx.z, k_per_split, npix, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<TILE_M, TILE_N, true, false>(PixelsOfChannel<S>{dy, K, npix},
                                           Im2colByTap<S>{x, C, npix}, m0, n0,
                                           k_begin, k_end, acc);
    float* out = partial + (size_t)blockIdx.z * K * C * 9;
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int k, int kk, float v) {
        if (k < K && kk < C * 9) out[k * C * 9 + kk] = v;
    });
}

// Entry points with the naive kernels' arguments; H == W == 14 (checked by the caller).
// grid (ceil(N*196/64), ceil(K/64))
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
conv2d_forward_fast(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    conv2d_forward_tiled<CONV2_SIZE>(x, w, y, N, C, K);
}

// grid (ceil(N*196/128), ceil(C/32), splits); partial [splits, N, C, H, W] (with one split: dx itself).
// Two blocks per SM: at 80 registers its 32x128 tile spills.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
conv2d_backward_input_fast(const float* dy, const float* w, float* partial, int N, int C, int K, int H, int W,
                           int k_per_split) {
    conv2d_backward_input_tiled<CONV2_SIZE>(dy, w, partial, N, C, K, k_per_split);
}

// grid (ceil(C*9/64), ceil(K/64), splits); partial [splits, K, C*9]
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
conv2d_backward_weight_fast(const float* x, const float* dy, float* partial, int N, int C, int K, int H,
                            int W, int k_per_split) {
    conv2d_backward_weight_tiled<CONV2_SIZE>(x, dy, partial, N, C, K, k_per_split);
}
