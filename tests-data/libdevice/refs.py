#!/usr/bin/env python3
"""Reference tables for crates/emu/tests/libdevice.rs, computed with mpmath (independent of the
emulator and of any libm).

refs_f64.tsv: every f64 function of math.cu on random inputs across its interesting ranges.
refs_f32.tsv: the f32 functions Rust's std lacks (erf, erfc, erfinv, lgamma, tgamma).

Columns: function, a, b ("-" for unary functions), hi, lo. a and b are the input bits as hex
(f64 bits; f32 inputs are f64-exact). hi is the exact result correctly rounded to f64 (Python's
int/int division rounds correctly, subnormals included), lo = exact - hi rounded to f64, so
hi + lo is the exact value to ~106 bits. Special values follow C99 Annex F (signed zeros,
infinities, NaN as 7ff8000000000000). Fixed seed: rerunning gives the same file.
"""
import math
import random
import struct
import sys
from fractions import Fraction

import mpmath
from mpmath import mp, mpf

PREC = 320          # working bits (60+ digits is ~200 bits)
N = 180             # random inputs per f64 function
N32 = 260           # random inputs per f32 table function
NAN = float("nan")
INF = float("inf")


def bits64(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def to_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def frac(v):
    """The exact rational value of a finite mpf."""
    sign, man, exp, _bc = v._mpf_
    f = Fraction(man) * (Fraction(2) ** exp)
    return -f if sign else f


def split(v):
    """(hi, lo) of an mpf or float: hi = RN(v) in f64, lo = RN(v - hi)."""
    if isinstance(v, float):
        return v, 0.0
    if mpmath.isnan(v):
        return NAN, 0.0
    if mpmath.isinf(v):
        return (INF if v > 0 else -INF), 0.0
    if v == 0:
        return 0.0, 0.0
    mag = mpmath.mag(v)
    if mag > 1100:
        return (INF if v > 0 else -INF), 0.0
    if mag < -1200:
        return (0.0 if v > 0 else -0.0), 0.0
    f = frac(v)
    try:
        hi = f.numerator / f.denominator
    except OverflowError:
        return (INF if v > 0 else -INF), 0.0
    if math.isinf(hi):
        return hi, 0.0
    hi = math.copysign(hi, v)  # underflow to zero keeps the sign
    lo = float(f - Fraction(hi)) if hi != 0 else 0.0
    return hi, lo


def is_int(x):
    return math.isfinite(x) and x == math.floor(x)


def is_odd_int(x):
    return is_int(x) and abs(x) < 2**53 and int(x) % 2 == 1


# ---- reference functions (x, y are floats; return mpf or float) ----

ODD_AT_ZERO = {"sin", "tan", "expm1", "log1p", "cbrt", "erf", "erfinv", "atan", "asin",
               "sinh", "tanh", "asinh", "atanh", "sqrt"}


def ref_unary(name, x):
    if math.isnan(x):
        return NAN
    if x == 0 and name in ODD_AT_ZERO:
        return x
    X = mpf(x)
    inf = math.isinf(x)
    if name in ("sin", "cos", "tan"):
        if inf:
            return NAN
        with mp.workprec(PREC + max(0, mpmath.mag(X))):
            return getattr(mpmath, name)(X)
    if name == "exp":
        return mpmath.exp(X)
    if name == "exp2":
        return mpmath.power(2, X)
    if name == "exp10":
        return mpmath.power(10, X)
    if name == "expm1":
        return mpmath.expm1(X)
    if name in ("log", "log2", "log10", "log1p"):
        arg = X + 1 if name == "log1p" else X
        if x == -INF or (name == "log1p" and x < -1) or (name != "log1p" and x < 0):
            return NAN
        if arg == 0:
            return -INF
        if inf:
            return INF
        if name == "log1p":
            return mpmath.log1p(X)
        return mpmath.log(X, {"log": mpmath.e, "log2": 2, "log10": 10}[name])
    if name == "sqrt":
        return NAN if x < 0 else mpmath.sqrt(X)
    if name == "rsqrt":
        if x == 0:
            return math.copysign(INF, x)
        return NAN if x < 0 else 1 / mpmath.sqrt(X)
    if name == "cbrt":
        return mpmath.sign(X) * mpmath.cbrt(abs(X))
    if name == "erf":
        return mpmath.erf(X)
    if name == "erfc":
        return mpmath.erfc(X)
    if name == "erfinv":
        if abs(x) > 1:
            return NAN
        if abs(x) == 1:
            return math.copysign(INF, x)
        return mpmath.erfinv(X)
    if name == "lgamma":
        if inf or x == 0 or (x < 0 and is_int(x)):
            return INF
        return mpmath.re(mpmath.loggamma(X))
    if name == "tgamma":
        if x == 0:
            return math.copysign(INF, x)
        if x == -INF or (x < 0 and is_int(x)):
            return NAN
        if x > 200:
            return INF
        return mpmath.gamma(X)
    if name == "atan":
        return mpmath.atan(X)
    if name in ("asin", "acos"):
        return NAN if abs(x) > 1 else getattr(mpmath, name)(X)
    if name in ("sinh", "cosh", "tanh"):
        if inf:
            return {"sinh": x, "cosh": INF, "tanh": math.copysign(1.0, x)}[name]
        if name != "tanh" and abs(x) > 800:
            return math.copysign(INF, x) if name == "sinh" else INF
        return getattr(mpmath, name)(X)
    if name == "asinh":
        return x if inf else mpmath.asinh(X)
    if name == "acosh":
        if x < 1:
            return NAN
        return INF if inf else mpmath.acosh(X)
    if name == "atanh":
        if abs(x) > 1:
            return NAN
        if abs(x) == 1:
            return math.copysign(INF, x)
        return mpmath.atanh(X)
    raise ValueError(name)


def ref_pow(x, y):
    if y == 0 or x == 1:
        return 1.0
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0:
        if y < 0:
            return math.copysign(INF, x) if is_odd_int(y) else INF
        return x if is_odd_int(y) else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return INF if (abs(x) < 1) == (y < 0) else 0.0
    if math.isinf(x):
        neg = x < 0 and is_odd_int(y)
        r = 0.0 if y < 0 else INF
        return -r if neg else r
    if x < 0 and not is_int(y):
        return NAN
    r = mpmath.power(mpf(abs(x)), mpf(y))
    return -r if x < 0 and is_odd_int(y) else r


def ref_atan2(a, b):
    """C atan2(a, b): a is the ordinate."""
    if math.isnan(a) or math.isnan(b):
        return NAN
    pi = +mpmath.pi
    s = -1 if math.copysign(1, a) < 0 else 1
    if a == 0:
        return a if math.copysign(1, b) > 0 else s * pi
    if math.isinf(a):
        if b == INF:
            return s * pi / 4
        if b == -INF:
            return s * 3 * pi / 4
        return s * pi / 2
    if b == 0:
        return s * pi / 2
    if b == INF:
        return math.copysign(0.0, a)
    if b == -INF:
        return s * pi
    return mpmath.atan2(mpf(a), mpf(b))


def ref_hypot(a, b):
    if math.isinf(a) or math.isinf(b):
        return INF
    if math.isnan(a) or math.isnan(b):
        return NAN
    return mpmath.sqrt(mpf(a) ** 2 + mpf(b) ** 2)


def ref_mod(a, b, nearest):
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return NAN
    if math.isinf(b) or a == 0:
        return a
    fa, fb = Fraction(a), Fraction(b)
    q = fa / fb
    n = math.trunc(q)
    if nearest:
        n = round(q)  # Python rounds halves to even
    r = fa - n * fb
    if r == 0:
        return math.copysign(0.0, a)
    return float(r)  # exact: fmod and remainder are representable


def ref(name, a, b):
    if name == "pow":
        return ref_pow(a, b)
    if name == "atan2":
        return ref_atan2(a, b)
    if name == "hypot":
        return ref_hypot(a, b)
    if name in ("fmod", "remainder"):
        return ref_mod(a, b, name == "remainder")
    return ref_unary(name, a)


# ---- inputs ----

class Gen:
    def __init__(self, rng, f32):
        self.rng = rng
        self.f32 = f32

    def r(self, x):
        return to_f32(x) if self.f32 else x

    def lu(self, e0, e1, signed=True):
        """Log-uniform: binary exponent uniform in [e0, e1), random significand."""
        e = self.rng.randrange(e0, e1)
        x = math.ldexp(1 + self.rng.random(), e)
        if signed and self.rng.random() < 0.5:
            x = -x
        return self.r(x)

    def uni(self, a, b):
        return self.r(self.rng.uniform(a, b))

    def near(self, c, k=40):
        """c rounded, then moved by up to k ulps."""
        x = self.r(c)
        k = self.rng.randrange(-k, k + 1)
        if not self.f32:
            b = bits64(x) + (k if x > 0 else -k)
            return struct.unpack("<d", struct.pack("<Q", b))[0]
        b = struct.unpack("<I", struct.pack("<f", x))[0] + (k if x > 0 else -k)
        return struct.unpack("<f", struct.pack("<I", b))[0]


def emin(f32):
    return (-149, -126, 128) if f32 else (-1074, -1022, 1024)


def unary_inputs(name, g, n):
    sub, nrm, top = emin(g.f32)
    rng = g.rng
    pi = math.pi
    big = 100 if g.f32 else 997  # 1e30 / 1e300
    gens = {
        "trig": [lambda: g.lu(sub, 0), lambda: g.uni(-10, 10), lambda: g.lu(0, big),
                 lambda: g.near(rng.randrange(-1000, 1000) * pi / 2, 3),
                 lambda: g.lu(big, top)],
        "exp": [lambda: g.uni(-745 if not g.f32 else -104, 710 if not g.f32 else 89),
                lambda: g.lu(sub, 0), lambda: g.uni(-1, 1)],
        "exp2": [lambda: g.uni(-1075 if not g.f32 else -150, 1024 if not g.f32 else 128),
                 lambda: g.lu(sub, 0)],
        "exp10": [lambda: g.uni(-324 if not g.f32 else -46, 308.3 if not g.f32 else 38.6),
                  lambda: g.lu(sub, 0)],
        "expm1": [lambda: g.uni(-40, 710 if not g.f32 else 89), lambda: g.lu(sub, 0),
                  lambda: g.uni(-1, 1)],
        "log": [lambda: abs(g.lu(sub, top)), lambda: g.uni(0.5, 2), lambda: g.near(1.0, 200)],
        "log1p": [lambda: g.lu(sub, 0), lambda: abs(g.lu(0, top)), lambda: g.uni(-1, 1),
                  lambda: g.near(-1.0, 200)],
        "sqrt": [lambda: abs(g.lu(sub, top))],
        "cbrt": [lambda: g.lu(sub, top)],
        "erf": [lambda: g.uni(-6, 6), lambda: g.lu(sub, 3)],
        "erfc": [lambda: g.uni(-6, 27 if not g.f32 else 11), lambda: g.lu(sub, 0),
                 lambda: g.uni(-1, 1)],
        "erfinv": [lambda: g.uni(-1, 1), lambda: g.lu(sub, 0),
                   lambda: g.near(1.0 if rng.random() < .5 else -1.0, 3000)],
        "lgamma": [lambda: abs(g.lu(sub, top)), lambda: g.uni(0, 10), lambda: g.near(1.0, 50),
                   lambda: g.near(2.0, 50),
                   lambda: g.uni(-40, -23.0001) if not g.f32 else g.uni(-30, -10.001),
                   lambda: g.uni(-2.2637, -0.0001) if not g.f32 else g.uni(-2.264, -0.0001)],
        "tgamma": [lambda: g.uni(0, 172 if not g.f32 else 36), lambda: g.lu(sub, 0),
                   lambda: g.uni(-170 if not g.f32 else -40, 0), lambda: g.uni(-5, 5)],
        "atan": [lambda: g.lu(sub, top), lambda: g.uni(-4, 4)],
        "asin": [lambda: g.uni(-1, 1), lambda: g.lu(sub, 0),
                 lambda: g.near(1.0 if rng.random() < .5 else -1.0, 3000)],
        "hyp": [lambda: g.uni(-20, 20), lambda: g.lu(sub, 0),
                lambda: g.uni(-711, 711) if not g.f32 else g.uni(-90, 90)],
        "asinh": [lambda: g.lu(sub, top), lambda: g.uni(-4, 4)],
        "acosh": [lambda: abs(g.lu(0, top)), lambda: g.near(1.0, 3000), lambda: g.uni(1, 4)],
        "atanh": [lambda: g.uni(-1, 1), lambda: g.lu(sub, 0),
                  lambda: g.near(1.0 if rng.random() < .5 else -1.0, 3000)],
    }
    kind = {"sin": "trig", "cos": "trig", "tan": "trig", "log2": "log", "log10": "log",
            "rsqrt": "sqrt", "acos": "asin", "sinh": "hyp", "cosh": "hyp",
            "tanh": "hyp"}.get(name, name)
    fs = gens[kind]
    xs = [fs[i % len(fs)]() for i in range(n)]
    specials = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, 2.0, -2.0, 3.0,
                math.ldexp(1, sub), -math.ldexp(1, sub), math.ldexp(1, nrm)]
    return [(x, None) for x in xs + [g.r(s) for s in specials]]


def binary_inputs(name, g, n):
    sub, nrm, top = emin(g.f32)
    rng = g.rng
    out = []
    for i in range(n):
        k = i % 4
        if name == "pow":
            if k == 0:
                p = (abs(g.lu(-20, 20)), g.uni(-30, 30))
            elif k == 1:
                p = (g.uni(0.5, 2), g.uni(-2000, 2000) if not g.f32 else g.uni(-300, 300))
            elif k == 2:
                p = (g.lu(-8, 8), float(rng.randrange(-40, 40)))
            else:
                p = (abs(g.lu(sub, top)), g.uni(-3, 3))
        elif name == "fmod" or name == "remainder":
            p = (g.lu(sub, top), g.lu(sub, top)) if k < 2 else (g.lu(-10, 30), g.lu(-10, 10))
            if k == 3:  # exact halves exercise remainder's ties-to-even
                y = g.lu(-5, 5)
                p = (g.r((rng.randrange(-200, 200) + 0.5) * y), y)
        elif name == "atan2":
            p = (g.lu(sub, top), g.lu(sub, top)) if k < 2 else (g.uni(-4, 4), g.uni(-4, 4))
        else:  # hypot
            if k == 0:
                p = (g.lu(sub, top), g.lu(sub, top))
            elif k == 1:
                e = rng.randrange(nrm, top - 1)
                p = (g.lu(e - 2, e + 1), g.lu(e - 30, e + 1))
            else:
                p = (g.uni(-10, 10), g.uni(-10, 10))
        out.append(p)
    sp = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 2.0, -0.5, 3.0]
    for a in sp:
        for b in sp:
            if rng.random() < 0.4 or name == "pow":
                out.append((g.r(a), g.r(b)))
    return out


BINARY = ("pow", "atan2", "hypot", "fmod", "remainder")
F64 = ["sin", "cos", "tan", "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p",
       "pow", "sqrt", "rsqrt", "cbrt", "erf", "erfc", "erfinv", "lgamma", "tgamma", "atan",
       "atan2", "asin", "acos", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "hypot",
       "fmod", "remainder"]
F32 = ["erf", "erfc", "erfinv", "lgamma", "tgamma"]


def write(path, names, g, n):
    with open(path, "w") as f:
        f.write("# generated by refs.py (mpmath %s, %d bits): fn a b hi lo\n"
                % (mpmath.__version__, PREC))
        for name in names:
            pairs = (binary_inputs if name in BINARY else unary_inputs)(name, g, n)
            for a, b in pairs:
                hi, lo = split(ref(name, a, b))
                if math.isnan(hi):
                    hi = NAN
                bs = "-" if b is None else "%016x" % bits64(b)
                f.write("%s\t%016x\t%s\t%016x\t%016x\n"
                        % (name, bits64(a), bs, bits64(hi), bits64(lo)))
            print(name, len(pairs), file=sys.stderr)


def main():
    """refs.py [N [SEED [DIR]]]: more inputs or another seed for a soak run (the test reads
    DIR's tables when PTXFORGE_LIBDEVICE_REFS=DIR); no arguments regenerates the committed ones."""
    mp.prec = PREC
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20261202
    out = sys.argv[3] if len(sys.argv) > 3 else "."
    write(out + "/refs_f64.tsv", F64, Gen(random.Random(seed), False), n)
    write(out + "/refs_f32.tsv", F32, Gen(random.Random(seed ^ 0x5EED), True), n * N32 // N)


if __name__ == "__main__":
    main()
