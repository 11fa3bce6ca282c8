// tensor_core.cuh: the tensor-core building blocks of the fast products: TF32 splitting for 3xTF32,
// bf16 packing, the products' Precision, mma.sync (any GPU since Ampere), Hopper's warpgroup MMA (wgmma,
// compiled for sm_90a only), ldmatrix, cp.async copies from global to shared memory, mbarriers, and the
// warpgroups' register split (setmaxnreg, sm_90a).
#pragma once

// Tensor cores. mma.sync m16n8k8 multiplies a 16x8 tile of A by an 8x8 tile of B into a 16x8 tile of
// C, spread over the 32 lanes of a warp. With lane = 4*g + t (g = lane/4, t = lane%4), PTX's fragment
// layout for TF32 is: a[r] = A(g + 8*(r%2), t + 4*(r/2)); b[r] = B(t + 4*r, g);
// c[r] = C(g + 8*(r/2), 2*t + r%2).
//
// TF32 keeps 10 of float32's 23 mantissa bits. To keep float32 accuracy ("3xTF32"), each operand is
// split into a TF32 "big" part (its low 13 mantissa bits cleared: one AND) and the exact remainder
// "small" = v - big, and a*b = big*big + big*small + small*big (small*small, ~2^-22 relative, is
// dropped). The tensor core reads only the top 19 bits of small, a further ~2^-22 relative. Three
// tensor-core products still cost far fewer instructions than float32 FMAs.
__device__ __forceinline__ void split_tf32(float v, unsigned* big, unsigned* small) {
    *big = __float_as_uint(v) & 0xffffe000u;
    *small = __float_as_uint(v - __uint_as_float(*big));
}

__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a * b in 3xTF32 from the operands' split parts; the small terms first: they are the least significant.
__device__ __forceinline__ void mma_3xtf32(float c[4], const unsigned a_big[4], const unsigned a_small[4],
                                           const unsigned b_big[2], const unsigned b_small[2]) {
    mma_tf32(c, a_small, b_big);
    mma_tf32(c, a_big, b_small);
    mma_tf32(c, a_big, b_big);
}

// bf16 products: a 16-bit float with float32's exponent and 8 bits of mantissa (2^-9 relative rounding),
// as torch.autocast(dtype=torch.bfloat16) multiplies. m16n8k16 takes pairs of bf16 along k in one
// register, the lower k in the lower half: a[r] = A(g + 8*(r%2), 2t + 8*(r/2) + {0, 1});
// b[r] = B(2t + 8*r + {0, 1}, g); c as in m16n8k8.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {  // rounded to nearest, ties to even
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The precision of a product, a template parameter of the fast products' entry points. Fp32 keeps
// float32's accuracy (3xTF32); Tf32 rounds both operands to the nearest TF32 and multiplies once (train
// --precision tf32, as cuDNN's TF32 convolutions); Bf16 rounds them to bf16 and multiplies once
// (--precision bf16, as torch.autocast with bfloat16). Every precision accumulates in float32.
enum class Precision { Fp32, Tf32, Bf16 };

// v's TF32 big parts into big, the remainders into small.
__device__ __forceinline__ void split4(const float v[4], float4* big, float4* small) {
    unsigned b[4], s[4];
#pragma unroll
    for (int i = 0; i < 4; i++) split_tf32(v[i], &b[i], &s[i]);
    *big = make_float4(__uint_as_float(b[0]), __uint_as_float(b[1]), __uint_as_float(b[2]), __uint_as_float(b[3]));
    *small = make_float4(__uint_as_float(s[0]), __uint_as_float(s[1]), __uint_as_float(s[2]), __uint_as_float(s[3]));
}

// Values per 16 staged bytes: 4 in float32's layouts (Fp32, Tf32), 8 in bf16.
template <Precision PR>
constexpr int staged_values = PR == Precision::Bf16 ? 8 : 4;

// staged_values<PR> values as the products read them (conv2's and fc1's staged operands), 16 bytes.
// 3xTF32 (Fp32): their big and small parts. Plain TF32: rounded to the nearest TF32 (unbiased, unlike the
// big part's truncation: a weight gradient sums 12,544 products per value at batch 64), no small part.
// Bf16: eight values rounded to the nearest bf16, no small part.
template <Precision PR>
__device__ __forceinline__ void stage16(const float* v, float4* big, float4* small) {
    if constexpr (PR == Precision::Bf16) {
        *reinterpret_cast<uint4*>(big) =
            make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
    } else if constexpr (PR == Precision::Tf32) {
        unsigned r[4];
#pragma unroll
        for (int i = 0; i < 4; i++) asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r[i]) : "f"(v[i]));
        *big = make_float4(__uint_as_float(r[0]), __uint_as_float(r[1]), __uint_as_float(r[2]), __uint_as_float(r[3]));
    } else {
        split4(v, big, small);
    }
}

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
// The same copies with a source size: bytes past `bytes` (0 to the copy's size) are written as zeros and
// not read, so a copy that runs past a matrix's edge fills the tile with zeros.
__device__ __forceinline__ void cp_async4_fill(float* shared, const float* global, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global), "r"(bytes));
}
__device__ __forceinline__ void cp_async16_fill(float* shared, const float* global, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global), "r"(bytes));
}
// A ring of copies: commit closes the group of copies this thread issued since the last commit; wait<N>
// returns once at most N of its groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// An mbarrier in shared memory: a phase completes once `count` threads have arrived (init), each arrive
// releasing what its thread wrote before it; wait_parity returns once the phase of that parity has completed,
// acquiring what was released into it. Threads that hand buffers to each other wait on these instead of a barrier
// of them all. (try_wait suspends the thread for a while inside the hardware; test_wait, before sm_90, polls.)
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_wait_parity(unsigned long long* bar, int parity) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT;\n}" ::"r"((unsigned)__cvta_generic_to_shared(bar)),
        "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n .reg .pred done;\n WAIT:\n mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT;\n}" ::"r"((unsigned)__cvta_generic_to_shared(bar)),
        "r"(parity)
        : "memory");
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- Hopper warpgroup MMA (PTX ISA: wgmma) --------------------------------------------------------
// A shared-memory matrix descriptor, no swizzle: leading = bytes from one core matrix to the next along
// k, stride = along the rows (A) or columns (B). Address and offsets in units of 16 bytes.
__device__ __forceinline__ unsigned long long wgmma_descriptor(const void* shared, unsigned leading, unsigned stride) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(shared);
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (unsigned long long)(leading >> 4) << 16 |
           (unsigned long long)(stride >> 4) << 32;
}
// fence: registers written by ordinary instructions (the zeroed accumulators) are visible to the wgmma
// that follow. commit: close the group of wgmma issued so far; wait: until all groups are done.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Shared memory written by ordinary stores and cp.async (the generic proxy) is visible to wgmma (the
// async proxy) after this fence, then a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// A warpgroup's registers per thread from here on (setmaxnreg): warpgroups that only stage data give theirs up
// (release) for those that hold the accumulators (claim, which waits until the registers are free).
template <int REGISTERS>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}

// d (64 x N, N/2 values per thread) += A (64 x 8, descriptor a) * B (8 x N, descriptor b), TF32.
// d[4j + r] = D(row 16*warp + g + 8*(r/2), column 8j + 2t + r%2), as mma.sync's c per 8 columns.
template <int N>
__device__ __forceinline__ void wgmma_tf32(float* d, unsigned long long a, unsigned long long b);
template <>
__device__ __forceinline__ void wgmma_tf32<96>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, 1, 1, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_tf32<112>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n112k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55}, "
        "%56, %57, 1, 1, 1;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
        : "l"(a), "l"(b));
}

// d (64 x N) += A (64 x 16, descriptor a) * B (16 x N, descriptor b), bf16 operands, float32 accumulators:
// the same layouts as wgmma_tf32 with 16-byte rows of 8 bf16 values (a core matrix is 8 x 8 here), both
// operands K-major (no transpose).
template <int N>
__device__ __forceinline__ void wgmma_bf16(float* d, unsigned long long a, unsigned long long b);
template <>
__device__ __forceinline__ void wgmma_bf16<96>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, %48, %49, 1, 1, 1, 0, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_bf16<112>(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55}, "
        "%56, %57, 1, 1, 1, 0, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
        : "l"(a), "l"(b));
}
#else
__device__ __forceinline__ void fence_proxy_async() {}
template <int REGISTERS>
__device__ __forceinline__ void release_registers() {}
template <int REGISTERS>
__device__ __forceinline__ void claim_registers() {}
// Four 8 x 8 tiles of 16-bit values (= 8 x 4 of 32-bit ones) from shared memory: lane l gives the
// address of row l % 8 of tile l / 8 (16 bytes), and receives 32-bit element l % 4 of row l / 4 of each
// tile: as mma's fragments need them (see below).
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const float* shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(shared)));
}
#endif
