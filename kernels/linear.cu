// linear.cu: fully connected layer y = x W^T + b, as torch.nn.Linear.
//   x [N,I], W [O,I], b [O] -> y [N,O]
//
// naive: one thread per output element of each product.
#include "common.cuh"

extern "C" __global__ void linear_forward_naive(const float* x, const float* w, const float* b, float* y,
                                                int N, int I, int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * O) return;
    int o = idx % O, n = idx / O;
    float acc = b[o];
    for (int i = 0; i < I; i++) acc += x[n * I + i] * w[o * I + i];
    y[idx] = acc;
}

// dx[n,i] = sum_o dy[n,o] * W[o,i]
extern "C" __global__ void linear_backward_input_naive(const float* dy, const float* w, float* dx,
                                                       int N, int I, int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * I) return;
    int i = idx % I, n = idx / I;
    float acc = 0.0f;
    for (int o = 0; o < O; o++) acc += dy[n * O + o] * w[o * I + i];
    dx[idx] = acc;
}

// dW[o,i] = sum_n dy[n,o] * x[n,i];  the last O threads also compute db[o] = sum_n dy[n,o].
extern "C" __global__ void linear_backward_params_naive(const float* x, const float* dy, float* dw,
                                                        float* db, int N, int I, int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < O * I) {
        int i = idx % I, o = idx / I;
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dy[n * O + o] * x[n * I + i];
        dw[idx] = acc;
    } else if (idx < O * I + O) {
        int o = idx - O * I;
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dy[n * O + o];
        db[o] = acc;
    }
}

// ---------------------------------------------------------------------------------------------------
// fast: the three products of fc1 on the shared tiled core (gemm.cuh). N is the batch.
#include "gemm.cuh"

// y = x W^T as C[n][o] = sum_i x[n,i] W[o,i]; the long i range is cut into gridDim.z splits whose
// partial results splitk_reduce sums (adding the bias and the ReLU).
// grid (ceil(O/64), ceil(N/64), splits); partial [splits, N, O]
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
linear_forward_fast(const float* x, const float* w, float* partial, int N, int I, int O, int k_per_split) {
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    int k_begin, k_end;
    split_range(blockIdx.z, k_per_split, I, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<TILE_M, TILE_N, true, false>(Dense{x, N, I, I, 1}, Dense{w, O, I, I, 1}, m0, n0, k_begin, k_end, acc);
    float* out = partial + (size_t)blockIdx.z * N * O;
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int n, int o, float v) {
        if (n < N && o < O) out[n * O + o] = v;
    });
}

// dx = dy W as C[n][i] = sum_o dy[n,o] W[o,i], in tiles TN columns wide.  grid (ceil(I/TN), ceil(N/64))
template <int TN>
__device__ __forceinline__ void linear_backward_input(const float* dy, const float* w, float* dx, int N, int I, int O) {
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TN;
    float acc[4][4];
    gemm_tile<TILE_M, TN, true, true>(Dense{dy, N, O, O, 1}, Dense{w, I, O, 1, I}, m0, n0, 0, O, acc);
    gemm_store<TILE_M, TN>(acc, m0, n0, [&](int n, int i, float v) {
        if (n < N && i < I) dx[n * I + i] = v;
    });
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
linear_backward_input_fast(const float* dy, const float* w, float* dx, int N, int I, int O) {
    linear_backward_input<TILE_N>(dy, w, dx, N, I, O);
}
// The same in tiles half as wide, for when the 64-wide ones would leave SMs idle (fc1 at batch 64: 49 of
// them): each warp's chain of steps then does half the products (bench at 64: 7.9 -> 6.1 us; at 512,
// where there are blocks enough, the wide tiles' fewer loads win: 16.5 against 20.9 us).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
linear_backward_input_narrow_fast(const float* dy, const float* w, float* dx, int N, int I, int O) {
    linear_backward_input<TILE_N / 2>(dy, w, dx, N, I, O);
}

// dW = dy^T x as C[o][i] = sum_n dy[n,o] x[n,i], the batch cut into gridDim.z splits.
// grid (ceil(I/64), ceil(O/64), splits); out [splits, O, I] (with one split: dW itself)
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
linear_backward_weight_fast(const float* x, const float* dy, float* out, int N, int I, int O, int k_per_split) {
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    int k_begin, k_end;
    split_range(blockIdx.z, k_per_split, N, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<TILE_M, TILE_N, false, true>(Dense{dy, O, N, 1, O}, Dense{x, I, N, 1, I}, m0, n0, k_begin, k_end,
                                           acc);
    float* dst = out + (size_t)blockIdx.z * O * I;
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int o, int i, float v) {
        if (o < O && i < I) dst[o * I + i] = v;
    });
}
