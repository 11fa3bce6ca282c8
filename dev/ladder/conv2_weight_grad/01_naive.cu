// Rung 01, naive: one thread per weight, a loop over every image and pixel, every operand read from global memory.
//   dw[k,c,r,s] = sum_n sum_{y,x} dy[n,k,y,x] * x[n,c,y+r-1,x+s-1]   (x [N,C,H,W], dy [N,K,H,W], zero padding 1)
//
// This is the product's naive kernel, conv2d_backward_weight_naive of kernels/naive/2_conv2d.cu, copied verbatim so
// that the ladder's files stand alone (tests/test_ladder.py keeps the two the same). It is the yardstick every later
// rung is checked and timed against. What it leaves on the table: the op is a reduction over N x H x W (the k of a
// matrix product) into only K x C x 9 outputs, and here each output's whole sum runs in one thread, a serial chain
// of N x H x W multiply-adds; at the network's geometry there are 18,432 threads, a fraction of what the GPU keeps
// in flight, and each reads its dy and x values alone (the 9 threads of a (k, c) pair read the same dy values).
//
// Launch (dev/ladder/conv2_weight_grad/op.py, launch_naive): one thread per element of dw, blocks of 256 threads.


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
