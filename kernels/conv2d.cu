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

// Copies from global to shared memory that bypass registers (cp.async; wait_all waits for this
// thread's, then a barrier makes everyone's visible).
__device__ __forceinline__ void cp_async4(float* shared, const float* global) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global));
}
__device__ __forceinline__ void cp_async16(float* shared, const float* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---- forward and input gradient: one image per block, the image staged in shared memory ----------
//
// Both are the same operation, a 3x3 convolution of a stack of 14x14 images:
//   out[img, n, p] = sum_{c, tap} in[img, c, p + shift(tap)] * wt(n, c, tap)
// forward: in = x, wt(n, c, tap) = w[n, c, tap]; input gradient: in = dy, wt(n, c, tap) = w[c, n, 8 - tap]
// (the flipped kernel, with w's two channel indices swapped).
//
// A block computes one image's pixels (rows) for NT output channels (columns) as a matrix product
// on the tensor cores (gemm.cuh's 3xTF32 mma). The input image passes through shared memory CONV_CHUNK
// channels at a time, with a zero border: 16x16 pixels for the 14x14 image. Within a chunk, k = tap*8 + c
// (mma k-step s is tap s, its 8 columns the chunk's 8 channels).
//
// Rows are positions on the 16-wide staged grid, not pixels: row r is output pixel (r / 16, r % 16),
// and the 14 x 16 = 224 rows are the block's 7 warps x 32 (columns 14 and 15 are computed and dropped,
// as many rows as 196 pixels in 224 rows left idle before). Row r's window then starts at staged pixel r,
// so the im2col element (row r, tap s, channel c) is staged pixel r + shift(s): a per-thread address plus
// a compile-time constant. The product loop has no index arithmetic, bounds checks or branches, and every
// staged value is used by 9 taps x NT channels. The next chunk is fetched into registers while the
// tensor cores work on this one.
//
// Both operands are staged split into their TF32 parts (split once, not at every fragment load):
// - a staged pixel holds its 8 channels' big parts, then their small parts (then 4 floats of padding), so
//   one `ldmatrix` gives a warp a whole 16 x 8 A fragment: four 8 x 8 tiles of 16-bit halves, which is
//   a 8 x 4 tile of 32-bit values each, landing in each lane exactly as mma's A layout needs it. At 80
//   bytes per pixel, 8 consecutive pixels fall in 8 different 16-byte bank groups: no bank conflicts.
// - a weight *quad* (column n, tap, t) holds what lane (g = n % 8, t) needs for B in that k-step:
//   {big(c = t), big(t + 4), small(t), small(t + 4)}, one 16-byte load. The quads are made once per step
//   for both products by conv2d_stage_weights_fast (below), and copied chunk by chunk with cp.async into
//   two buffers: the next chunk's arrive while the tensor cores work on this one.
// Split at every fragment load, the loop spent 72 instructions per tap on 24 mma; now 8 (v9a, NOTES.md).
#define CONV2_SIZE 14
#define CONV_THREADS 224         // 7 warps x 32 rows: the 14 x 16 grid
#define CONV_CHUNK 8             // input channels per step: 8 x 9 taps = 72 k = 9 mma k-steps
#define FORWARD_TILE_N 32        // output channels per block of the forward
#define INPUT_GRAD_TILE_N 16     // and of the input gradient: twice the blocks (at batch 64, 64 blocks of
                                 // 32 channels left half the SMs idle; 16 halves its time there)
#define CONV_PADDED 16           // the staged image with its zero border, 16 x 16
#define CONV_STAGED_PIXELS 258   // 16 x 16 + 2: row 223's last tap reads pixel 257
#define CONV_PIXEL_FLOATS 20     // a staged pixel: 8 big parts, 8 small parts, 4 floats of padding
#define CONV_CHUNK_QUADS(NT) ((NT) * 9 * 4)  // weight quads per chunk: (column, tap, t)
// A block's shared memory, the staged image and two chunks of quads, is dynamic (it may exceed the 48 KB
// of static shared memory): mnist_cuda.kernels.conv_tile_shared_bytes gives its size.

// A 16 x 8 TF32 fragment of A from shared memory: lane l gives the address of row l % 16's 4 values of
// columns 4 * (l / 16) ... (8 x 8 tiles of 16-bit values = 8 x 4 tiles of 32-bit ones; the four tiles
// are rows 0-7 and 8-15 of columns 0-3, then of columns 4-7: mma's a[0..3]).
__device__ __forceinline__ void ldmatrix_x4(unsigned a[4], const float* shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"((unsigned)__cvta_generic_to_shared(shared)));
}

// v's TF32 big parts into big, the remainders into small.
__device__ __forceinline__ void split4(const float v[4], float4* big, float4* small) {
    unsigned b[4], s[4];
#pragma unroll
    for (int i = 0; i < 4; i++) split_tf32(v[i], &b[i], &s[i]);
    *big = make_float4(__uint_as_float(b[0]), __uint_as_float(b[1]), __uint_as_float(b[2]), __uint_as_float(b[3]));
    *small = make_float4(__uint_as_float(s[0]), __uint_as_float(s[1]), __uint_as_float(s[2]), __uint_as_float(s[3]));
}

// Weight quad q of a product with Cin input and Cout output channels, NT columns per block: quads are
// [column tile][chunk][column in tile][tap][t], so a block's chunk is CONV_CHUNK_QUADS(NT) consecutive
// quads. Channels past Cin and columns past Cout are zeros.
template <bool FLIPPED, int NT>
__device__ __forceinline__ void stage_weight_quad(const float* w, int Cin, int Cout, float4* quads, int q) {
    const int chunks = CEIL_DIV(Cin, CONV_CHUNK), e = q % CONV_CHUNK_QUADS(NT), chunk = q / CONV_CHUNK_QUADS(NT) % chunks;
    const int n = q / (CONV_CHUNK_QUADS(NT) * chunks) * NT + e / 36, tap = e / 4 % 9;
    unsigned big[2], small[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = chunk * CONV_CHUNK + e % 4 + 4 * h;
        // forward: w[n, c, tap]; input gradient: w[c, n, 8 - tap]
        const float v = c < Cin && n < Cout ? (FLIPPED ? w[(c * Cout + n) * 9 + 8 - tap] : w[(n * Cin + c) * 9 + tap])
                                            : 0.0f;
        split_tf32(v, &big[h], &small[h]);
    }
    quads[q] = make_float4(__uint_as_float(big[0]), __uint_as_float(big[1]), __uint_as_float(small[0]),
                           __uint_as_float(small[1]));
}

template <bool FLIPPED, int NT>
__device__ __forceinline__ void conv3x3_image_tile(const float* in, const float4* quads, float* out, int Cin,
                                                   int Cout) {
    constexpr int S = CONV2_SIZE, SS = S * S, P = CONV_PADDED, PF = CONV_PIXEL_FLOATS, NI = NT / 8;
    constexpr int W_QUADS = CONV_CHUNK_QUADS(NT), IN_TASKS = SS * 2;  // per chunk; image: (pixel, channel half)
    constexpr int IN_PER_THREAD = CEIL_DIV(IN_TASKS, CONV_THREADS);
    extern __shared__ float4 conv_shared[];
    float* in_s = reinterpret_cast<float*>(conv_shared);                         // [pixel][20]
    float4* w_s = conv_shared + CONV_STAGED_PIXELS * PF / 4;                     // [2][W_QUADS]
    const int img = blockIdx.x, n0 = blockIdx.y * NT, chunks = CEIL_DIV(Cin, CONV_CHUNK);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float* x = in + (size_t)img * Cin * SS;
    const float4* block_quads = quads + (size_t)blockIdx.y * chunks * W_QUADS;

    for (int i = tid; i < CONV_STAGED_PIXELS * PF / 4; i += CONV_THREADS)  // the border stays zero
        conv_shared[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    // This lane's ldmatrix rows at tap 0, for the warp's two 16-row tiles (big parts; small: + 8)
    const float* a_rows[2];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) a_rows[mi] = in_s + (warp * 32 + mi * 16 + lane % 16) * PF + 4 * (lane / 16);

    // in_next[r]: channels c0 + 4*half .. + 3 of pixel p, for task e = 2*p + half
    float in_next[IN_PER_THREAD][4];
    auto fetch = [&](int chunk) {  // the image's chunk into registers (zeros past Cin), its weights into w_s
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, p = e / 2;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = chunk * CONV_CHUNK + 4 * (e % 2) + i;
                in_next[r][i] = e < IN_TASKS && c < Cin ? x[c * SS + p] : 0.0f;
            }
        }
        float4* dst = w_s + (chunk % 2) * W_QUADS;
        for (int e = tid; e < W_QUADS; e += CONV_THREADS)
            cp_async16(reinterpret_cast<float*>(dst + e), reinterpret_cast<const float*>(block_quads + chunk * W_QUADS + e));
    };
    auto stash = [&]() {  // the image's registers into shared memory, split; pixels inside the border
#pragma unroll
        for (int r = 0; r < IN_PER_THREAD; r++) {
            const int e = tid + r * CONV_THREADS, p = e / 2;
            if (e < IN_TASKS) {
                float* pixel = in_s + ((p / S + 1) * P + p % S + 1) * PF + 4 * (e % 2);
                split4(in_next[r], reinterpret_cast<float4*>(pixel), reinterpret_cast<float4*>(pixel + 8));
            }
        }
    };

    float acc[2][NI][4] = {};
    fetch(0);
    for (int chunk = 0; chunk < chunks; chunk++) {
        cp_async_wait_all();
        __syncthreads();  // this chunk's quads are in; everyone is done with the previous chunk
        stash();
        __syncthreads();
        if (chunk + 1 < chunks) fetch(chunk + 1);  // in flight during the products below
        const float4* w_chunk = w_s + (chunk % 2) * W_QUADS;
#pragma unroll
        for (int s = 0; s < 9; s++) {  // tap s
            const int shift = ((s / 3) * P + s % 3) * PF;
            unsigned a_big[2][4], a_small[2][4], b_big[NI][2], b_small[NI][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                ldmatrix_x4(a_big[mi], a_rows[mi] + shift);
                ldmatrix_x4(a_small[mi], a_rows[mi] + shift + 8);
            }
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {  // b[r] = B(channel t + 4r, column g): gemm.cuh
                const uint4 q = *reinterpret_cast<const uint4*>(&w_chunk[((ni * 8 + g) * 9 + s) * 4 + t]);
                b_big[ni][0] = q.x;
                b_big[ni][1] = q.y;
                b_small[ni][0] = q.z;
                b_small[ni][1] = q.w;
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    mma_3xtf32(acc[mi][ni], a_big[mi], a_small[mi], b_big[ni], b_small[ni]);
        }
    }

    // c[r] = C(row g + 8*(r/2), column 2t + r%2); row = 16*(2*warp + mi) + g + 8h is pixel (2*warp + mi, g + 8h)
    float* y = out + (size_t)img * Cout * SS;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (g + 8 * h >= S) continue;  // columns 14 and 15 of the grid
            float* y_pixel = y + (2 * warp + mi) * S + g + 8 * h;
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int n = n0 + ni * 8 + 2 * t + j;
                    if (n < Cout) y_pixel[n * SS] = acc[mi][ni][2 * h + j];
                }
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
                for (int ni = 0; ni < NI; ni++)
                    mma_3xtf32(acc[j][ni], a_big[j], a_small[j], b_big[ni], b_small[ni]);
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

// Entry points; H == W == 14 (checked by the caller).
// The weight quads of both products from w [K, C, 3, 3], one thread per quad: forward_quads (C in, K out,
// FORWARD_TILE_N) first, then input_grad_quads (K in, C out, INPUT_GRAD_TILE_N; flipped).
extern "C" __global__ void conv2d_stage_weights_fast(const float* w, int C, int K, float4* forward_quads,
                                                     float4* input_grad_quads) {
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    const int forward = CEIL_DIV(K, FORWARD_TILE_N) * CEIL_DIV(C, CONV_CHUNK) * CONV_CHUNK_QUADS(FORWARD_TILE_N);
    const int input_grad = CEIL_DIV(C, INPUT_GRAD_TILE_N) * CEIL_DIV(K, CONV_CHUNK) * CONV_CHUNK_QUADS(INPUT_GRAD_TILE_N);
    if (q < forward) stage_weight_quad<false, FORWARD_TILE_N>(w, C, K, forward_quads, q);
    else if (q < forward + input_grad) stage_weight_quad<true, INPUT_GRAD_TILE_N>(w, K, C, input_grad_quads, q - forward);
}

// grid (N, ceil(K / FORWARD_TILE_N)), CONV_THREADS threads, conv_tile_shared_bytes(FORWARD_TILE_N)
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2)
conv2d_forward_fast(const float* x, const float4* forward_quads, float* y, int N, int C, int K, int H, int W) {
    conv3x3_image_tile<false, FORWARD_TILE_N>(x, forward_quads, y, C, K);
}

// grid (N, ceil(C / INPUT_GRAD_TILE_N)), CONV_THREADS threads, conv_tile_shared_bytes(INPUT_GRAD_TILE_N)
extern "C" __global__ void __launch_bounds__(CONV_THREADS, 2)
conv2d_backward_input_fast(const float* dy, const float4* input_grad_quads, float* dx, int N, int C, int K, int H,
                           int W) {
    conv3x3_image_tile<true, INPUT_GRAD_TILE_N>(dy, input_grad_quads, dx, K, C);
}

// grid (ceil(C / WGRAD_CHANNELS), ceil(K / WGRAD_OUT), groups), WGRAD_THREADS threads;
// partial [groups, K, C, 3, 3] (with one group: dw itself)
extern "C" __global__ void __launch_bounds__(WGRAD_THREADS)
conv2d_backward_weight_fast(const float* x, const float* dy, float* partial, int N, int C, int K, int H,
                            int W, int imgs_per_group) {
    conv3x3_weight_grad_images(x, dy, partial, N, C, K, imgs_per_group);
}
