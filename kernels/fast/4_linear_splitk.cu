// 4_linear_splitk.cu: fc1's three products on the tensor cores (3xTF32, or bf16 with --precision bf16): the
// fast form of naive/6_linear.cu and 4_relu.cu for fc1. The tiled mma.sync core (gemm_tile.cuh) runs on any
// GPU since Ampere; on Hopper (sm_90a) the input gradient also has a warpgroup-MMA form (wgmma_tile.cuh),
// which mnist_cuda/ops/linear_splitk.py chooses in bf16 at large batches (docs/performance.md). N is the
// batch. The precision is a template parameter of each entry point. Products whose reduction is long and
// whose output is small (the forward's k = 3136; the weight gradient's k = the batch) are cut along k into
// splits, each block writing a partial result that 6_splitk_reduce.cu sums in order. fc1's input x (block 2's
// pooled output) and its gradient dx are X, the type the step stores them in: bfloat16 in Bf16 (as torch.autocast
// keeps a linear layer's input and its gradient; the products round x to bf16 anyway, so they see the same values;
// dx is rounded to the nearest), float otherwise. fc1's weight W and its output's gradient dy are T: float, or in the
// bf16 step bfloat16 copies (W's made by linear_weight_to_bf16_fast before the forward, dy as the head writes it),
// whose values are those the products would round them to, in half the bytes: each operand tile is read by many
// blocks, and these products are bound by those reads (docs/performance.md).
//
// K models at once (kernels/include/common.cuh): model m's batch tensors are at m * (one model's size), its
// weight (and, from the weight gradient's single split, its gradient) at m * param_stride, and its partial
// results [splits][...] at m * splits * (one split's size), where 6_splitk_reduce.cu reads them. The split
// products' grids hold each model's splits in z (z = model * splits + split); the input gradient's z is the model.
#include "common.cuh"
#include "gemm_tile.cuh"
#include "wgmma_tile.cuh"

// y = x W^T as C[n][o] = sum_i x[n,i] W[o,i]; the long i range is cut into splits whose partial results
// splitk_reduce_fast sums (adding the bias and the ReLU).
// grid (ceil(O/64), ceil(N/64), models * splits); partial [models][splits, N, O]
template <Precision P, class X, class T>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
    linear_forward_fast(const X* x, const T* w, float* partial, int N, int I, int O, int k_per_split,
                        int param_stride) {
    const int splits = CEIL_DIV(I, k_per_split), model = model_index(splits), split = model_z(splits);
    x = model_part(x, (size_t)N * I, model);
    w = model_part(w, param_stride, model);
    partial = model_part(partial, (size_t)splits * N * O, model);
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    int k_begin, k_end;
    split_range(split, k_per_split, I, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<P, TILE_M, TILE_N, true, false>(dense(x, N, I, I, 1), dense(w, O, I, I, 1), m0, n0, k_begin, k_end, acc);
    float* out = partial + (size_t)split * N * O;
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int n, int o, float v) {
        if (n < N && o < O) out[n * O + o] = v;
    });
}

// dx[n * I + i] and dx[n * I + i + 1] (i even) of row n, those inside [N, I]: a bf16 pair as one 4-byte word where
// I is even (the word is then aligned), else value by value.
__device__ __forceinline__ void store_input_grad_pair(bfloat16* dx, int n, int i, int N, int I, float first,
                                                      float second) {
    if (n >= N) return;
    if (I % 2 == 0 && i + 1 < I) {
        store_pair(&dx[n * I + i], first, second);
    } else {
        if (i < I) store_value(&dx[n * I + i], first);
        if (i + 1 < I) store_value(&dx[n * I + i + 1], second);
    }
}

// dx = dy W as C[n][i] = sum_o dy[n,o] W[o,i], in tiles TN columns wide.  grid (ceil(I/TN), ceil(N/64), models)
template <Precision P, int TN, class X, class T>
__device__ __forceinline__ void linear_backward_input(const T* dy, const T* w, X* dx, int N, int I, int O,
                                                      int param_stride) {
    const int model = model_index();
    dy = model_part(dy, (size_t)N * O, model);
    w = model_part(w, param_stride, model);
    dx = model_part(dx, (size_t)N * I, model);
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TN;
    float acc[4][4];
    gemm_tile<P, TILE_M, TN, true, true>(dense(dy, N, O, O, 1), dense(w, I, O, 1, I), m0, n0, 0, O, acc);
    if constexpr (sizeof(X) == 2) {
        gemm_store_pairs<TILE_M, TN>(acc, m0, n0, [&](int n, int i, float first, float second) {
            store_input_grad_pair(dx, n, i, N, I, first, second);
        });
    } else {
        gemm_store<TILE_M, TN>(acc, m0, n0, [&](int n, int i, float v) {
            if (n < N && i < I) store_value(&dx[n * I + i], v);
        });
    }
}
template <Precision P, class X, class T>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
    linear_backward_input_fast(const T* dy, const T* w, X* dx, int N, int I, int O, int param_stride) {
    linear_backward_input<P, TILE_N>(dy, w, dx, N, I, O, param_stride);
}
// The same in tiles half as wide, for when the 64-wide ones would leave SMs idle (fc1 at batch 64: 49
// blocks): each warp's chain of steps then does half the products. Where there are blocks enough, the
// wide tiles' fewer loads win (docs/performance.md).
template <Precision P, class X, class T>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
    linear_backward_input_narrow_fast(const T* dy, const T* w, X* dx, int N, int I, int O, int param_stride) {
    linear_backward_input<P, TILE_N / 2>(dy, w, dx, N, I, O, param_stride);
}

// dW = dy^T x as C[o][i] = sum_n dy[n,o] x[n,i], the batch cut into splits. With one split the block writes
// the gradient itself (the launch contract passes dW as out), so a model's part of out is param_stride apart.
// grid (ceil(I/64), ceil(O/64), models * splits); out [models][splits, O, I] (with one split: dW)
template <Precision P, class X, class T>
__global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
    linear_backward_weight_fast(const X* x, const T* dy, float* out, int N, int I, int O, int k_per_split,
                                int param_stride) {
    const int splits = CEIL_DIV(N, k_per_split), model = model_index(splits), split = model_z(splits);
    x = model_part(x, (size_t)N * I, model);
    dy = model_part(dy, (size_t)N * O, model);
    out = model_part(out, splits == 1 ? (size_t)param_stride : (size_t)splits * O * I, model);
    const int m0 = blockIdx.y * TILE_M, n0 = blockIdx.x * TILE_N;
    int k_begin, k_end;
    split_range(split, k_per_split, N, &k_begin, &k_end);
    float acc[4][4];
    gemm_tile<P, TILE_M, TILE_N, false, true>(dense(dy, O, N, 1, O), dense(x, I, N, 1, I), m0, n0, k_begin, k_end, acc);
    float* dst = out + (size_t)split * O * I;
    gemm_store<TILE_M, TILE_N>(acc, m0, n0, [&](int o, int i, float v) {
        if (o < O && i < I) dst[o * I + i] = v;
    });
}

// ---- Hopper (sm_90a): the input gradient on wgmma_tile.cuh --------------------------------------------
// Compiled for other GPUs as an empty kernel, which the launch contract never launches there.

// As linear_backward_input_fast, in tiles of 64 samples x WG_INPUT_GRAD_COLS inputs; W is read
// n-contiguous (its rows are fc1's outputs, k here) and transposed as it is staged.
// grid (ceil(I/WG_INPUT_GRAD_COLS), ceil(N/64), models)
template <Precision P, class X, class T>
__global__ void __launch_bounds__(WG_THREADS)
    linear_backward_input_wgmma_fast(const T* dy, const T* w, X* dx, int N, int I, int O, int param_stride) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ float4 wg_shared[];
    const int model = model_index();
    dy = model_part(dy, (size_t)N * O, model);
    w = model_part(w, param_stride, model);
    dx = model_part(dx, (size_t)N * I, model);
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * WG_INPUT_GRAD_COLS;
    float acc[WG_INPUT_GRAD_COLS / 2];
    wgmma_tile<P, WG_INPUT_GRAD_COLS>(dy, N, O, w, I, I, m0, n0, O, acc, wg_shared);
    if constexpr (sizeof(X) == 2) {
        wgmma_store_pairs<WG_INPUT_GRAD_COLS>(acc, m0, n0, [&](int n, int i, float first, float second) {
            store_input_grad_pair(dx, n, i, N, I, first, second);
        });
    } else {
        wgmma_store<WG_INPUT_GRAD_COLS>(acc, m0, n0, [&](int n, int i, float v) {
            if (n < N && i < I) store_value(&dx[n * I + i], v);
        });
    }
#endif
}

// W's bf16 copy for the bf16 step's products (T = bfloat16 above): each value rounded to the nearest, as the products
// round it when they read a float W. A thread per value of each model (the grid's z): w's weights param_stride apart,
// the copies count apart.
extern "C" __global__ void linear_weight_to_bf16_fast(const float* w, bfloat16* copy, int count, int param_stride) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const int model = model_index();
    store_value(&model_part(copy, count, model)[i], model_part(w, param_stride, model)[i]);
}
