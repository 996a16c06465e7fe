// Element-wise libdevice math kernels for the emulator's ULP test (crates/emu/tests/libdevice.rs).
// Each kernel applies one CUDA math function to n inputs; f32_* use the float functions, f64_* the
// double ones. Compiled without fast math (build.sh), so nvcc inlines libdevice's accurate paths;
// one more build with -ftz=true -DF32_ONLY takes libdevice's flush-to-zero f32 paths.

#define UNARY(NAME, T, EXPR)                                                                   \
    extern "C" __global__ void NAME(const T *__restrict__ a, T *__restrict__ out, int n) {     \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                         \
        if (i < n) {                                                                           \
            T x = a[i];                                                                        \
            out[i] = (EXPR);                                                                   \
        }                                                                                      \
    }

#define BINARY(NAME, T, EXPR)                                                                  \
    extern "C" __global__ void NAME(const T *__restrict__ a, const T *__restrict__ b,          \
                                    T *__restrict__ out, int n) {                              \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                         \
        if (i < n) {                                                                           \
            T x = a[i];                                                                        \
            T y = b[i];                                                                        \
            out[i] = (EXPR);                                                                   \
        }                                                                                      \
    }

// sincos writes both results: sin to out, cos to out2.
#define SINCOS(NAME, T, FN)                                                                    \
    extern "C" __global__ void NAME(const T *__restrict__ a, T *__restrict__ out,              \
                                    T *__restrict__ out2, int n) {                             \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                         \
        if (i < n) {                                                                           \
            T s, c;                                                                            \
            FN(a[i], &s, &c);                                                                  \
            out[i] = s;                                                                        \
            out2[i] = c;                                                                       \
        }                                                                                      \
    }

UNARY(f32_sin, float, sinf(x))
UNARY(f32_cos, float, cosf(x))
UNARY(f32_tan, float, tanf(x))
UNARY(f32_exp, float, expf(x))
UNARY(f32_exp2, float, exp2f(x))
UNARY(f32_exp10, float, exp10f(x))
UNARY(f32_expm1, float, expm1f(x))
UNARY(f32_log, float, logf(x))
UNARY(f32_log2, float, log2f(x))
UNARY(f32_log10, float, log10f(x))
UNARY(f32_log1p, float, log1pf(x))
BINARY(f32_pow, float, powf(x, y))
UNARY(f32_sqrt, float, sqrtf(x))
UNARY(f32_rsqrt, float, rsqrtf(x))
UNARY(f32_cbrt, float, cbrtf(x))
UNARY(f32_erf, float, erff(x))
UNARY(f32_erfc, float, erfcf(x))
UNARY(f32_erfinv, float, erfinvf(x))
UNARY(f32_lgamma, float, lgammaf(x))
UNARY(f32_tgamma, float, tgammaf(x))
UNARY(f32_atan, float, atanf(x))
BINARY(f32_atan2, float, atan2f(x, y))
UNARY(f32_asin, float, asinf(x))
UNARY(f32_acos, float, acosf(x))
UNARY(f32_sinh, float, sinhf(x))
UNARY(f32_cosh, float, coshf(x))
UNARY(f32_tanh, float, tanhf(x))
UNARY(f32_asinh, float, asinhf(x))
UNARY(f32_acosh, float, acoshf(x))
UNARY(f32_atanh, float, atanhf(x))
BINARY(f32_hypot, float, hypotf(x, y))
BINARY(f32_fmod, float, fmodf(x, y))
BINARY(f32_remainder, float, remainderf(x, y))
SINCOS(f32_sincos, float, sincosf)

#ifndef F32_ONLY
UNARY(f64_sin, double, sin(x))
UNARY(f64_cos, double, cos(x))
UNARY(f64_tan, double, tan(x))
UNARY(f64_exp, double, exp(x))
UNARY(f64_exp2, double, exp2(x))
UNARY(f64_exp10, double, exp10(x))
UNARY(f64_expm1, double, expm1(x))
UNARY(f64_log, double, log(x))
UNARY(f64_log2, double, log2(x))
UNARY(f64_log10, double, log10(x))
UNARY(f64_log1p, double, log1p(x))
BINARY(f64_pow, double, pow(x, y))
UNARY(f64_sqrt, double, sqrt(x))
UNARY(f64_rsqrt, double, rsqrt(x))
UNARY(f64_cbrt, double, cbrt(x))
UNARY(f64_erf, double, erf(x))
UNARY(f64_erfc, double, erfc(x))
UNARY(f64_erfinv, double, erfinv(x))
UNARY(f64_lgamma, double, lgamma(x))
UNARY(f64_tgamma, double, tgamma(x))
UNARY(f64_atan, double, atan(x))
BINARY(f64_atan2, double, atan2(x, y))
UNARY(f64_asin, double, asin(x))
UNARY(f64_acos, double, acos(x))
UNARY(f64_sinh, double, sinh(x))
UNARY(f64_cosh, double, cosh(x))
UNARY(f64_tanh, double, tanh(x))
UNARY(f64_asinh, double, asinh(x))
UNARY(f64_acosh, double, acosh(x))
UNARY(f64_atanh, double, atanh(x))
BINARY(f64_hypot, double, hypot(x, y))
BINARY(f64_fmod, double, fmod(x, y))
BINARY(f64_remainder, double, remainder(x, y))
SINCOS(f64_sincos, double, sincos)
#endif
