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
// fast: tensor-core matrix products (gemm.cuh). The spatial size is a compile-time constant (14:
// conv2's) so the index arithmetic is multiplies and shifts, not divisions.
#include "gemm.cuh"

// ---- forward and input gradient: one image per block, the image staged in shared memory ----------
//
// Both are the same operation, a 3x3 convolution of a stack of 14x14 images:
//   out[img, n, p] = sum_{c, tap} in[img, c, p + shift(tap)] * wt(n, c, tap)
// forward: in = x, wt(n, c, tap) = w[n, c, tap]; input gradient: in = dy, wt(n, c, tap) = w[c, n, 8 - tap]
// (the flipped kernel, with w's two channel indices swapped).
//
// A block computes one image's pixels (rows) for NT output channels (columns) as a matrix
// product on the tensor cores (gemm.cuh's 3xTF32 mma). The input image passes through shared memory
// CONV_CHUNK channels at a time, with a zero border: 16x16 per channel for the 14x14 image. Within a
// chunk, k = tap*8 + c (mma k-step s is tap s, its 8 columns the chunk's 8 channels), so the im2col
// element (pixel p, tap s, channel c) sits at in_s[row(p) + c*CONV_CHANNEL_STRIDE + shift(s)]: a
// per-thread register plus a compile-time constant. The product loop has no index arithmetic, no
// bounds checks and no branches, and every staged value is used by 9 taps x NT channels.
// The next chunk is fetched into registers while the tensor cores work on this one.
#define CONV2_SIZE 14
#define CONV_THREADS 224         // 7 warps x 32 pixels: one 14x14 image (196) in 224 rows
#define CONV_CHUNK 8             // input channels per step: 8 x 9 taps = 72 k = 9 mma k-steps
#define FORWARD_TILE_N 32        // output channels per block of the forward
#define INPUT_GRAD_TILE_N 16     // and of the input gradient: twice the blocks (at batch 64, 64 blocks of
                                 // 32 channels left half the SMs idle; 16 halves its time there)
#define CONV_PADDED 16           // the staged image with its zero border, 16 x 16
#define CONV_CHANNEL_STRIDE 264  // floats per staged channel, 256 + 8: a fragment load reads 8 pixels of
                                 // 4 channels, and the 4 channels then start 8 banks apart
#define CONV_W_STRIDE 76         // floats per staged weight row, 72 + 4: the 8 rows x 4 columns of a
                                 // fragment load hit banks 12*row + column, all different

template <bool FLIPPED, int NT>
__device__ __forceinline__ void conv3x3_image_tile(const float* in, const float* w, float* out, int Cin,
                                                   int Cout) {
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, CS = CONV_CHANNEL_STRIDE, WS = CONV_W_STRIDE;
    constexpr int KC = CONV_CHUNK * 9, NI = NT / 8;
    constexpr int IN_PER_THREAD = CONV_CHUNK * SS / CONV_THREADS, W_PER_THREAD = CEIL_DIV(NT * KC, CONV_THREADS);
    static_assert(IN_PER_THREAD * CONV_THREADS == CONV_CHUNK * SS, "the threads stage a chunk exactly");
    __shared__ float in_s[CONV_CHUNK * CS];
    __shared__ float w_s[NT * WS];
    const int img = blockIdx.x, n0 = blockIdx.y * NT;
    const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
    const float* x = in + (size_t)img * Cin * SS;

    for (int i = tid; i < CONV_CHUNK * CS; i += CONV_THREADS) in_s[i] = 0.0f;  // the border stays zero

    // The shared-memory offsets of this thread's A fragment elements at tap 0: rows (pixels) g and
    // g + 8 of its warp's two 16-row tiles, columns (channels) t and t + 4.
    int a_offset[2][2][2];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int p = warp * 32 + mi * 16 + g + 8 * h;
            const int row = p < SS ? (p / S) * P + p % S : 0;  // rows past the image: any valid address
            a_offset[mi][h][0] = row + t * CS;
            a_offset[mi][h][1] = row + (t + 4) * CS;
        }

    float in_next[IN_PER_THREAD], w_next[W_PER_THREAD];
    auto fetch = [&](int c0) {  // chunk c0 from global memory into registers (zeros past the ends)
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = c0 * SS + tid + r * CONV_THREADS;  // consecutive threads, consecutive addresses
            in_next[r] = e < Cin * SS ? x[e] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < W_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS;
            if (FLIPPED) {  // w[c0 + c, n0 + n, tap]: NT*9 consecutive floats per c
                const int c = e / (NT * 9), n = e % (NT * 9) / 9, tap = e % 9;
                const bool ok = e < NT * KC && c0 + c < Cin && n0 + n < Cout;
                w_next[r] = ok ? w[((c0 + c) * Cout + n0 + n) * 9 + tap] : 0.0f;
            } else {  // w[n0 + n, c0*9 + k]: KC consecutive floats per n
                const int n = e / KC, k = e % KC;
                const bool ok = e < NT * KC && n0 + n < Cout && c0 * 9 + k < Cin * 9;
                w_next[r] = ok ? w[(n0 + n) * Cin * 9 + c0 * 9 + k] : 0.0f;
            }
        }
    };
    auto stash = [&]() {  // registers into shared memory: pixels inside the border, weights by tap
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, c = e / SS, p = e % SS;
            in_s[c * CS + (p / S + 1) * P + p % S + 1] = in_next[r];
        }
#pragma unroll
        for (int r = 0; r < W_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS;
            if (e < NT * KC) {  // w_s[n][tap*8 + c]
                if (FLIPPED) w_s[(e % (NT * 9) / 9) * WS + (8 - e % 9) * CONV_CHUNK + e / (NT * 9)] = w_next[r];
                else w_s[(e / KC) * WS + (e % KC % 9) * CONV_CHUNK + e % KC / 9] = w_next[r];
            }
        }
    };

    float acc[2][NI][4] = {};
    fetch(0);
    for (int c0 = 0; c0 < Cin; c0 += CONV_CHUNK) {
        __syncthreads();  // everyone is done with the previous chunk
        stash();
        __syncthreads();
        if (c0 + CONV_CHUNK < Cin) fetch(c0 + CONV_CHUNK);  // in flight during the products below
#pragma unroll
        for (int s = 0; s < 9; s++) {  // tap s
            const int shift = (s / 3) * P + s % 3;
            unsigned a_big[2][4], a_small[2][4], b_big[NI][2], b_small[NI][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    split_tf32(in_s[a_offset[mi][r % 2][r / 2] + shift], &a_big[mi][r], &a_small[mi][r]);
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    split_tf32(w_s[(ni * 8 + g) * WS + 8 * s + t + 4 * r], &b_big[ni][r], &b_small[ni][r]);
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {  // small terms first: they are the least significant
                    mma_tf32(acc[mi][ni], a_small[mi], b_big[ni]);
                    mma_tf32(acc[mi][ni], a_big[mi], b_small[ni]);
                    mma_tf32(acc[mi][ni], a_big[mi], b_big[ni]);
                }
        }
    }

    float* y = out + (size_t)img * Cout * SS;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int p = warp * 32 + mi * 16 + g + 8 * (r / 2), n = n0 + ni * 8 + 2 * t + r % 2;
                if (p < SS && n < Cout) y[n * SS + p] = acc[mi][ni][r];
            }
}

// ---- weight gradient: images staged in shared memory, as for the forward --------------------------
//
//   dw[o, c, tap] = sum_img sum_p x[img, c, p + shift(tap)] * dy[img, o, p]
// is a matrix product with rows (tap, c), columns o, and k running over the pixels of the images.
// A block owns WGRAD_CHANNELS input channels, WGRAD_OUT output channels and a group of images. Per
// image it stages its channels of x (with the zero border, as in the forward) and of dy in shared memory
// with cp.async (straight to shared memory, no registers), then each of its 6 warps multiplies 3 taps
// (a 16-row mma tile per tap: the 16 channels) by the WGRAD_OUT columns over half of the pixels; the
// two halves' sums are added at the end (two warps per output tile keep twice the warps busy). Each group writes a partial
// result [group, K, C, 9]; splitk_reduce sums them in group order (deterministic).
#define WGRAD_THREADS 192            // 6 warps: kernel rows 0, 1, 2 (3 taps each) x two halves of the pixels
#define WGRAD_HALF 104               // pixels of the first half: 13 of the 25 k-steps
#define WGRAD_CHANNELS 16            // input channels per block: the 16 rows of an mma tile
#define WGRAD_OUT 32                 // output channels per block
#define WGRAD_PIXELS 200             // an image's 196 pixels in 25 k-steps of 8; 196..199 read zeros of dy
#define WGRAD_DY_STRIDE 204          // floats per staged dy row: 196 pixels, then zeros; 204 = 12 mod 32,
                                     // so a fragment load's 8 rows x 4 columns hit different banks
#define WGRAD_CHANNEL_STRIDE 260     // floats per staged x channel (16x16 + 4): a fragment load reads 8
                                     // channels x 4 adjacent pixels, 4 banks apart per channel

__device__ __forceinline__ void cp_async4(float* shared, const float* global) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global));
}
__device__ __forceinline__ void cp_async16(float* shared, const float* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void conv3x3_weight_grad_images(const float* x, const float* dy, float* partial, int N,
                                                           int C, int K, int imgs_per_group) {
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, CS = WGRAD_CHANNEL_STRIDE, DS = WGRAD_DY_STRIDE;
    constexpr int CH = WGRAD_CHANNELS, NO = WGRAD_OUT, NI = NO / 8;
    __shared__ __align__(16) float x_s[CH * CS];
    __shared__ __align__(16) float dy_s[NO * DS];
    __shared__ int row_of[WGRAD_PIXELS];  // pixel -> its offset in a staged channel (less the border)
    const int c0 = blockIdx.x * CH, o0 = blockIdx.y * NO, group = blockIdx.z;
    const int tid = threadIdx.x, g = tid % 32 / 4, t = tid % 4;
    const int tap_row = tid / 32 % 3, half = tid / 96;  // this warp's kernel row and half of the pixels
    const int k_begin = half * WGRAD_HALF, k_end = half ? WGRAD_PIXELS : WGRAD_HALF;

    // Zeros that staging never overwrites: the border, dy past pixel 196, channels past C or K.
    for (int i = tid; i < CH * CS; i += WGRAD_THREADS) x_s[i] = 0.0f;
    for (int i = tid; i < NO * DS; i += WGRAD_THREADS) dy_s[i] = 0.0f;
    for (int p = tid; p < WGRAD_PIXELS; p += WGRAD_THREADS) row_of[p] = p < SS ? (p / S) * P + p % S : 0;

    float acc[3][NI][4] = {};
    const int img_end = min(N, (group + 1) * imgs_per_group);
    for (int img = group * imgs_per_group; img < img_end; img++) {
        __syncthreads();  // the previous image's products are done (and the zeros are written)
        const float* xi = x + ((size_t)img * C + c0) * SS;
        for (int e = tid; e < CH * SS; e += WGRAD_THREADS) {
            const int c = e / SS, p = e % SS;
            if (c0 + c < C) cp_async4(&x_s[c * CS + (p / S + 1) * P + p % S + 1], xi + e);
        }
        const float* dyi = dy + ((size_t)img * K + o0) * SS;
        for (int e = tid; e < NO * SS / 4; e += WGRAD_THREADS) {  // 49 float4s per row, 16-byte aligned
            const int o = e / (SS / 4), q = e % (SS / 4);
            if (o0 + o < K) cp_async16(&dy_s[o * DS + 4 * q], dyi + 4 * e);
        }
        cp_async_wait_all();
        __syncthreads();
#pragma unroll 4
        for (int k0 = k_begin; k0 < k_end; k0 += 8) {
            // A(row = channel g or g + 8 of tap 3*tap_row + j, k = pixel) = x_s[channel + shift(tap) + row_of[pixel]]
            const int at0 = row_of[k0 + t] + tap_row * P, at1 = row_of[k0 + t + 4] + tap_row * P;
            unsigned a_big[3][4], a_small[3][4], b_big[NI][2], b_small[NI][2];
#pragma unroll
            for (int j = 0; j < 3; j++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    split_tf32(x_s[(g + 8 * (r % 2)) * CS + (r / 2 ? at1 : at0) + j], &a_big[j][r], &a_small[j][r]);
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    split_tf32(dy_s[(ni * 8 + g) * DS + k0 + t + 4 * r], &b_big[ni][r], &b_small[ni][r]);
#pragma unroll
            for (int j = 0; j < 3; j++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {  // small terms first: they are the least significant
                    mma_tf32(acc[j][ni], a_small[j], b_big[ni]);
                    mma_tf32(acc[j][ni], a_big[j], b_small[ni]);
                    mma_tf32(acc[j][ni], a_big[j], b_big[ni]);
                }
        }
    }

    // The second half's sums through shared memory (dy_s is free now) into the first half's.
    constexpr int ACC = 3 * NI * 4;
    static_assert(WGRAD_THREADS / 2 * ACC <= NO * DS, "dy_s holds the second half's sums");
    float* acc_s = dy_s;
    __syncthreads();
    if (half) {
#pragma unroll
        for (int i = 0; i < ACC; i++) acc_s[i * (WGRAD_THREADS / 2) + tid - WGRAD_THREADS / 2] = (&acc[0][0][0])[i];
    }
    __syncthreads();
    if (half) return;
#pragma unroll
    for (int i = 0; i < ACC; i++) (&acc[0][0][0])[i] += acc_s[i * (WGRAD_THREADS / 2) + tid];

    float* out = partial + (size_t)group * K * C * 9;
#pragma unroll
    for (int j = 0; j < 3; j++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int c = c0 + g + 8 * (r / 2), o = o0 + ni * 8 + 2 * t + r % 2;
                if (c < C && o < K) out[(o * C + c) * 9 + 3 * tap_row + j] = acc[j][ni][r];
            }
}

// Entry points with the naive kernels' arguments; H == W == 14 (checked by the caller).
// grid (N, ceil(K / FORWARD_TILE_N)), CONV_THREADS threads
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2)
conv2d_forward_fast(const float* x, const float* w, float* y, int N, int C, int K, int H, int W) {
    conv3x3_image_tile<false, FORWARD_TILE_N>(x, w, y, C, K);
}

// grid (N, ceil(C / INPUT_GRAD_TILE_N)), CONV_THREADS threads
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2)
conv2d_backward_input_fast(const float* dy, const float* w, float* dx, int N, int C, int K, int H, int W) {
    conv3x3_image_tile<true, INPUT_GRAD_TILE_N>(dy, w, dx, K, C);
}

// grid (ceil(C / WGRAD_CHANNELS), ceil(K / WGRAD_OUT), groups), WGRAD_THREADS threads;
// partial [groups, K, C, 3, 3] (with one group: dw itself)
extern "C" __global__ void __launch_bounds__(WGRAD_THREADS)
conv2d_backward_weight_fast(const float* x, const float* dy, float* partial, int N, int C, int K, int H,
                            int W, int imgs_per_group) {
    conv3x3_weight_grad_images(x, dy, partial, N, C, K, imgs_per_group);
}
