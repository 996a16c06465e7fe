//! TMA im2col mode and tensor-map editing (issue 16 item 3), each kernel checked by ptxas for
//! sm_90a and run on the emulator against a host reference written here, element by element,
//! on random tensors, corners, traversal strides, offsets and coordinates:
//!
//! - `cp.async.bulk.tensor.{3,4,5}d ... .im2col` loads (with and without `.L2::cache_hint`,
//!   swizzled and not, each after a `cp.async.bulk.prefetch.tensor ... .im2col` of the same
//!   box), and a `.multicast::cluster` one into both CTAs of a cluster; the whole
//!   shared-memory box is dumped (output poisoned first) and compared byte for byte with the
//!   reference box, swizzle included;
//! - `.im2col_no_offs` stores and `cp.reduce.async.bulk.tensor` reductions for every operation
//!   and element type the PTX ISA defines (and `.tile` reductions), against f64 / integer
//!   references (one rounding to the element type);
//! - `tensormap.replace` (every field; shared::cta and global spaces), `tensormap.cp_fenceproxy`
//!   and the `fence.proxy.tensormap::generic` fences (`.cta`, `.cluster`, `.gpu`, `.sys`): a
//!   kernel rewrites a map for another tensor and then loads through it.

use emu::hopper::{Im2colParams, Swizzle, TensorMapDesc, TmaType};
use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use half::{bf16, f16};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::Mutex;

/// Assembles each distinct kernel text once with ptxas for sm_90a (when ptxas is available).
fn ptxas(text: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap();
    if !seen
        .get_or_insert_with(HashSet::new)
        .insert(text.to_string())
    {
        return;
    }
    if ptx::ptxas::ptxas_for_tests("tma_im2col test PTX").is_some() {
        let r = ptx::ptxas::assemble(text, "sm_90a", &Default::default())
            .unwrap_or_else(|e| panic!("ptxas rejects the test PTX: {e}\n{text}"));
        for k in &r.kernels {
            assert_eq!(
                k.spill_stores_bytes + k.spill_loads_bytes,
                0,
                "spills in {}",
                k.name
            );
        }
    }
}

/// A dense-with-padding tensor of rank 3..5 in global memory (dimension 0 innermost).
struct Tensor {
    dtype: TmaType,
    dims: Vec<u64>,
    /// Byte strides of dimensions 1..rank.
    strides: Vec<u64>,
    data: Vec<u8>,
}

impl Tensor {
    fn random(rg: &mut StdRng, dtype: TmaType, dims: Vec<u64>) -> Tensor {
        let es = dtype.size() as u64;
        let mut strides = Vec::new();
        let mut s = (dims[0] * es).div_ceil(16) * 16 + 16 * rg.gen_range(0..2);
        for d in &dims[1..] {
            strides.push(s);
            s *= d;
        }
        let mut t = Tensor {
            dtype,
            dims,
            strides,
            data: vec![0; s as usize],
        };
        let n: u64 = t.dims.iter().product();
        for i in 0..n {
            let v = random_elem(rg, dtype);
            let o = t.offset_of_linear(i);
            t.data[o..o + es as usize].copy_from_slice(&v.to_le_bytes()[..es as usize]);
        }
        t
    }
    fn offset_of_linear(&self, mut i: u64) -> usize {
        let mut o = (i % self.dims[0]) * self.dtype.size() as u64;
        i /= self.dims[0];
        for (k, d) in self.dims[1..].iter().enumerate() {
            o += (i % d) * self.strides[k];
            i /= d;
        }
        o as usize
    }
    /// Byte offset of the element at `idx` (one per dimension), or None outside the tensor.
    fn offset(&self, idx: &[i64]) -> Option<usize> {
        let mut o = 0u64;
        for (k, &x) in idx.iter().enumerate() {
            if x < 0 || x >= self.dims[k] as i64 {
                return None;
            }
            o += if k == 0 {
                x as u64 * self.dtype.size() as u64
            } else {
                x as u64 * self.strides[k - 1]
            };
        }
        Some(o as usize)
    }
    fn desc(&self, base: u64, sw: Swizzle, im2col: Option<Im2colParams>) -> TensorMapDesc {
        let r = self.dims.len();
        let mut d = TensorMapDesc {
            dtype: self.dtype,
            rank: r as u32,
            global_address: base,
            dims: [1; 5],
            strides: [0; 4],
            box_dims: [1; 5],
            elem_strides: [1; 5],
            swizzle: sw,
            oob_nan: false,
            interleave: 0,
            im2col,
        };
        for k in 0..r {
            d.dims[k] = self.dims[k] as u32;
        }
        d.strides[..r - 1].copy_from_slice(&self.strides);
        d
    }
}

/// A random element (finite for float types), as its bits.
fn random_elem(rg: &mut StdRng, t: TmaType) -> u64 {
    let x: f32 = rg.gen_range(-4.0..4.0);
    match t {
        TmaType::F16 => f16::from_f32(x).to_bits() as u64,
        TmaType::Bf16 => bf16::from_f32(x).to_bits() as u64,
        TmaType::F32 => x.to_bits() as u64,
        TmaType::F64 => (x as f64 * 1.000001).to_bits(),
        _ => rg.gen(),
    }
}

/// The swizzle pattern, written out: 16-byte chunk `(a >> 4) & m` XOR row `(a >> 7) & m`.
fn swz(sw: Swizzle, a: u64) -> u64 {
    let m = match sw {
        Swizzle::None => 0,
        Swizzle::B32 => 1,
        Swizzle::B64 => 3,
        Swizzle::B128 => 7,
    };
    let chunk = ((a >> 4) & m) ^ ((a >> 7) & m);
    (a & !(m << 4)) | (chunk << 4)
}

/// One im2col copy: the map's im2col parameters, spatial traversal strides, coordinates
/// (`c, spatial..., n`) and offsets.
#[derive(Clone, Debug)]
struct Case {
    p: Im2colParams,
    strides: Vec<u32>,
    coords: Vec<i64>,
    offsets: Vec<i64>,
    swizzle: Swizzle,
}

/// The (pixel, tensor index or None) sequence of an im2col copy, by the PTX ISA's rules.
fn pixels(t: &Tensor, c: &Case) -> Vec<Vec<Option<Vec<i64>>>> {
    let r = t.dims.len();
    let sp = r - 2;
    let mut pos: Vec<i64> = c.coords[1..r - 1].to_vec();
    let mut n = c.coords[r - 1];
    let mut out = Vec::new();
    for _ in 0..c.p.pixels_per_column {
        let mut px = Vec::new();
        for ch in 0..c.p.channels_per_pixel as i64 {
            let mut idx = vec![c.coords[0] + ch];
            for (s, x) in pos.iter().enumerate() {
                idx.push(x + c.offsets.get(s).copied().unwrap_or(0));
            }
            idx.push(n);
            px.push(t.offset(&idx).map(|_| idx));
        }
        out.push(px);
        // next pixel: W by its stride, wrapping to the lower corner and carrying into H, D, N
        let mut s = 0;
        loop {
            if s == sp {
                n += 1;
                break;
            }
            pos[s] += c.strides[s] as i64;
            if pos[s] <= t.dims[1 + s] as i64 - 1 + c.p.upper[s] as i64 {
                break;
            }
            pos[s] = c.p.lower[s] as i64;
            s += 1;
        }
    }
    out
}

/// The shared-memory bytes of the loaded box (swizzled at a 1024-aligned base), zero fill.
fn load_ref(t: &Tensor, c: &Case) -> Vec<u8> {
    let es = t.dtype.size() as usize;
    let cpp = c.p.channels_per_pixel as usize;
    let mut out = vec![0u8; c.p.pixels_per_column as usize * cpp * es];
    for (pix, px) in pixels(t, c).into_iter().enumerate() {
        for (ch, idx) in px.into_iter().enumerate() {
            let o = swz(c.swizzle, ((pix * cpp + ch) * es) as u64) as usize;
            if let Some(idx) = idx {
                let g = t.offset(&idx).unwrap();
                out[o..o + es].copy_from_slice(&t.data[g..g + es]);
            }
        }
    }
    out
}

const LOAD: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry k(.param .u64 tmap, .param .u64 out, .param .u32 bytes, .param .u32 c0, .param .u32 c1, .param .u32 c2, .param .u32 c3, .param .u32 c4, .param .u32 o0, .param .u32 o1, .param .u32 o2)
{
    .reg .pred %p<4>;
    .reg .b32 %r<40>;
    .reg .b16 %h<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [tmap];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r20, [bytes];
    ld.param.u32 %r21, [c0];
    ld.param.u32 %r22, [c1];
    ld.param.u32 %r23, [c2];
    ld.param.u32 %r24, [c3];
    ld.param.u32 %r25, [c4];
    ld.param.u32 %r26, [o0];
    ld.param.u32 %r27, [o1];
    ld.param.u32 %r28, [o2];
    cvt.u16.u32 %h1, %r26;
    cvt.u16.u32 %h2, %r27;
    cvt.u16.u32 %h3, %r28;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, smem;
    add.u32 %r3, %r2, %r20;          // the mbarrier after the box
    mov.u32 %r9, %cluster_ctarank;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r3], 1;
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r3], %r20;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    setp.eq.u32 %p3, %r9, 0;
    and.pred %p3, %p3, %p1;
    mov.u16 %h0, 3;
    mov.u64 %rd4, 0x1000000000000000;
    @%p3 COPY;
W:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r3], 0;
    @!%p2 bra W;
    // out[ctaid * bytes + i] = smem[i], one word per thread and step
    mov.u32 %r10, %ctaid.x;
    mul.lo.u32 %r11, %r10, %r20;
    shl.b32 %r4, %r1, 2;
L:
    setp.ge.u32 %p2, %r4, %r20;
    @%p2 bra DONE;
    add.u32 %r5, %r2, %r4;
    ld.shared.u32 %r6, [%r5];
    add.u32 %r12, %r11, %r4;
    cvt.u64.u32 %rd5, %r12;
    add.s64 %rd6, %rd2, %rd5;
    st.global.u32 [%rd6], %r6;
    add.u32 %r4, %r4, 512;
    bra L;
DONE:
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"#;

/// The load kernel for a rank, with the cache hint and/or multicast.
fn load_kernel(rank: usize, hint: bool, multicast: bool) -> String {
    let coords: Vec<String> = (0..rank).map(|i| format!("%r{}", 21 + i)).collect();
    let offs: Vec<String> = (1..rank - 1).map(|i| format!("%h{i}")).collect();
    let mut copy = format!(
        "cp.async.bulk.tensor.{rank}d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes{}{} [%r2], [%rd1, {{{}}}], [%r3], {{{}}}",
        if multicast { ".multicast::cluster" } else { "" },
        if hint { ".L2::cache_hint" } else { "" },
        coords.join(", "),
        offs.join(", ")
    );
    if multicast {
        copy += ", %h0";
    }
    if hint {
        copy += ", %rd4";
    }
    // an L2 prefetch of the same box first (a hint: no effect a thread can see)
    let prefetch = format!(
        "cp.async.bulk.prefetch.tensor.{rank}d.L2.global.im2col{} [%rd1, {{{}}}], {{{}}}{}",
        if hint { ".L2::cache_hint" } else { "" },
        coords.join(", "),
        offs.join(", "),
        if hint { ", %rd4" } else { "" }
    );
    LOAD.replace("COPY", &format!("{prefetch};\n    @%p3 {copy}"))
}

fn params(ptrs: &[u64], words: &[i64]) -> Vec<u8> {
    let mut p = Vec::new();
    for x in ptrs {
        p.extend_from_slice(&x.to_le_bytes());
    }
    for &w in words {
        p.extend_from_slice(&(w as i32).to_le_bytes());
    }
    p
}

/// Random tensor and im2col copy of `rank`.
fn random_case(rg: &mut StdRng, rank: usize) -> (Tensor, Case) {
    let dtype = [TmaType::U8, TmaType::F16, TmaType::F32, TmaType::F64][rg.gen_range(0..4)];
    let es = dtype.size();
    let swizzle = [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128][rg.gen_range(0..4)];
    // channels: a multiple of 16 bytes; with a swizzle, one span per pixel (so the swizzled
    // box stays within its bytes)
    let cpp = match swizzle {
        Swizzle::None => 16 * rg.gen_range(1..=8) / es,
        s => s.width() / es,
    };
    let mut dims = vec![rg.gen_range(8..40u64)];
    for _ in 1..rank - 1 {
        dims.push(rg.gen_range(2..7));
    }
    dims.push(rg.gen_range(1..4));
    let t = Tensor::random(rg, dtype, dims);
    let sp = rank - 2;
    let mut p = Im2colParams {
        channels_per_pixel: cpp,
        pixels_per_column: rg.gen_range(1..=40),
        ..Default::default()
    };
    for s in 0..sp {
        p.lower[s] = rg.gen_range(-2..=1);
        p.upper[s] = rg.gen_range(-2..=1);
    }
    let mut coords = vec![rg.gen_range(-(cpp as i64) / 2..t.dims[0] as i64)];
    for s in 0..sp {
        let (lo, hi) = (
            p.lower[s] as i64,
            t.dims[1 + s] as i64 - 1 + p.upper[s] as i64,
        );
        coords.push(rg.gen_range(lo.min(hi)..=lo.max(hi)));
    }
    coords.push(rg.gen_range(0..t.dims[rank - 1] as i64));
    let case = Case {
        p,
        strides: (0..sp).map(|_| rg.gen_range(1..=3)).collect(),
        coords,
        offsets: (0..sp).map(|_| rg.gen_range(0..=2)).collect(),
        swizzle,
    };
    (t, case)
}

/// Runs one im2col load (multicast into a 2-CTA cluster when `multicast`); returns each CTA's
/// box as dumped.
fn run_load(t: &Tensor, c: &Case, hint: bool, multicast: bool) -> Vec<Vec<u8>> {
    let rank = t.dims.len();
    let text = load_kernel(rank, hint, multicast);
    ptxas(&text);
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let g = mem.alloc(t.data.len() as u64, 0).unwrap();
    g.write_bytes(0, &t.data);
    let mut d = t.desc(g.base, c.swizzle, Some(c.p.clone()));
    for (s, &st) in c.strides.iter().enumerate() {
        d.elem_strides[1 + s] = st;
    }
    let tm = mem.alloc(128, 0).unwrap();
    tm.write_bytes(0, &d.to_bytes());
    let bytes = d.box_bytes();
    let ctas = if multicast { 2 } else { 1 };
    let out = mem.alloc(bytes * ctas, 0).unwrap();
    out.fill(0, bytes * ctas, &[0xee]);
    let mut words = vec![bytes as i64];
    words.extend((0..5).map(|i| c.coords.get(i).copied().unwrap_or(0)));
    words.extend((0..3).map(|i| c.offsets.get(i).copied().unwrap_or(0)));
    let cfg = LaunchConfig {
        cluster: [ctas as u32, 1, 1],
        shared_bytes: bytes as u32 + 16,
        ..LaunchConfig::linear(ctas as u32, 128)
    };
    let p = params(&[tm.base, out.base], &words);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e} ({c:?})"));
    let mut o = vec![0u8; (bytes * ctas) as usize];
    out.read_bytes(0, &mut o);
    o.chunks(bytes as usize).map(|x| x.to_vec()).collect()
}

#[test]
fn im2col_loads_match_the_reference_for_3d_4d_5d() {
    let mut rg = StdRng::seed_from_u64(16);
    for rank in 3..=5 {
        for i in 0..6 {
            let (t, c) = random_case(&mut rg, rank);
            let hint = i % 2 == 1;
            let got = run_load(&t, &c, hint, false);
            assert_eq!(
                got[0],
                load_ref(&t, &c),
                "rank {rank}, case {c:?}, dims {:?}",
                t.dims
            );
        }
    }
}

#[test]
fn im2col_multicast_load_reaches_both_ctas() {
    let mut rg = StdRng::seed_from_u64(17);
    for rank in [4, 5] {
        let (t, c) = random_case(&mut rg, rank);
        let want = load_ref(&t, &c);
        let got = run_load(&t, &c, rank == 4, true);
        assert_eq!(got[0], want, "rank 0, {c:?}");
        assert_eq!(got[1], want, "rank 1 (multicast), {c:?}");
    }
}

/// A hand-worked case: a 3d NWC f32 tensor (4 channels, W = 4, N = 2) with a 1-pixel padding
/// box (lower corner -1, upper -1: base positions w = -1..2) and offset 2 (filter tap 2), from
/// w = -1: the 8 pixels read w + 2 = 1, 2, 3, 4 of image 0, then of image 1; w = 4 is outside
/// the tensor and reads zeros.
#[test]
fn im2col_padding_example() {
    let mut rg = StdRng::seed_from_u64(18);
    let t = Tensor::random(&mut rg, TmaType::F32, vec![4, 4, 2]);
    let c = Case {
        p: Im2colParams {
            lower: [-1, 0, 0],
            upper: [-1, 0, 0],
            channels_per_pixel: 4,
            pixels_per_column: 8,
        },
        strides: vec![1],
        coords: vec![0, -1, 0],
        offsets: vec![2],
        swizzle: Swizzle::None,
    };
    let got = run_load(&t, &c, false, false).remove(0);
    // the box walks w = -1, 0, 1, 2 of image 0 then of image 1 and reads w + 2 = 1, 2, 3, 4:
    // the last pixel of each image is outside the tensor (zeros)
    let f = |b: &[u8], pix: usize, ch: usize| {
        f32::from_le_bytes(
            b[(pix * 4 + ch) * 4..(pix * 4 + ch) * 4 + 4]
                .try_into()
                .unwrap(),
        )
    };
    for pix in 0..8 {
        let (n, w) = (pix / 4, pix % 4 + 1);
        for ch in 0..4 {
            let want = match t.offset(&[ch as i64, w as i64, n as i64]) {
                Some(o) => f32::from_le_bytes(t.data[o..o + 4].try_into().unwrap()),
                None => 0.0,
            };
            assert_eq!(
                f(&got, pix, ch).to_bits(),
                want.to_bits(),
                "pixel {pix} channel {ch}"
            );
        }
    }
    assert_eq!(got, load_ref(&t, &c));
}

const STORE: &str = r#"
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry k(.param .u64 tmap, .param .u64 src, .param .u32 bytes, .param .u32 c0, .param .u32 c1, .param .u32 c2, .param .u32 c3, .param .u32 c4)
{
    .reg .pred %p<4>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [tmap];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r20, [bytes];
    ld.param.u32 %r21, [c0];
    ld.param.u32 %r22, [c1];
    ld.param.u32 %r23, [c2];
    ld.param.u32 %r24, [c3];
    ld.param.u32 %r25, [c4];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, smem;
    // smem[i] = src[i], one word per thread and step
    shl.b32 %r4, %r1, 2;
L:
    setp.ge.u32 %p2, %r4, %r20;
    @%p2 bra GO;
    cvt.u64.u32 %rd5, %r4;
    add.s64 %rd6, %rd2, %rd5;
    ld.global.u32 %r6, [%rd6];
    add.u32 %r5, %r2, %r4;
    st.shared.u32 [%r5], %r6;
    add.u32 %r4, %r4, 512;
    bra L;
GO:
    fence.proxy.async.shared::cta;
    bar.sync 0;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 COPY;
    @%p1 cp.async.bulk.commit_group;
    @%p1 cp.async.bulk.wait_group 0;
    ret;
}
"#;

/// A store (`op` None) or reduction kernel of `rank` in `mode` (`im2col_no_offs` or `tile`).
fn store_kernel(rank: usize, op: Option<&str>, mode: &str) -> String {
    let coords: Vec<String> = (0..rank).map(|i| format!("%r{}", 21 + i)).collect();
    let head = match op {
        Some(op) => format!("cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.{op}.{mode}"),
        None => format!("cp.async.bulk.tensor.{rank}d.global.shared::cta.{mode}"),
    };
    let copy = format!("{head}.bulk_group [%rd1, {{{}}}], [%r2]", coords.join(", "));
    STORE.replace("COPY", &copy)
}

/// The element reduction `op` on `ty` (bits), computed independently: integers exactly, floats
/// in f64 with one rounding to the element type.
fn reduce_ref(op: &str, ty: TmaType, old: u64, v: u64) -> u64 {
    let fl = |b: u64| match ty {
        TmaType::F16 => f16::from_bits(b as u16).to_f64(),
        TmaType::Bf16 => bf16::from_bits(b as u16).to_f64(),
        _ => f32::from_bits(b as u32) as f64,
    };
    let back = |x: f64| match ty {
        TmaType::F16 => f16::from_f64(x).to_bits() as u64,
        TmaType::Bf16 => bf16::from_f64(x).to_bits() as u64,
        _ => (x as f32).to_bits() as u64,
    };
    if matches!(ty, TmaType::F16 | TmaType::Bf16 | TmaType::F32) {
        let (a, b) = (fl(old), fl(v));
        return back(match op {
            "add" => a + b,
            "min" => a.min(b),
            _ => a.max(b),
        });
    }
    let (bits, signed) = match ty {
        TmaType::U32 => (32, false),
        TmaType::I32 => (32, true),
        TmaType::U64 => (64, false),
        _ => (64, true),
    };
    let mask = if bits == 32 { 0xffff_ffff } else { u64::MAX };
    let sx = |x: u64| {
        if signed {
            ((x << (64 - bits)) as i64 >> (64 - bits)) as i128
        } else {
            (x & mask) as i128
        }
    };
    let (a, b) = (sx(old), sx(v));
    let r: i128 = match op {
        "add" => a + b,
        "min" => a.min(b),
        "max" => a.max(b),
        "and" => a & b,
        "or" => a | b,
        "xor" => a ^ b,
        "inc" => {
            if a >= b {
                0
            } else {
                a + 1
            }
        }
        "dec" => {
            if a == 0 || a > b {
                b
            } else {
                a - 1
            }
        }
        _ => unreachable!("{op}"),
    };
    (r as u64) & mask
}

/// Runs a store or reduction of the box in `src` into `t`; returns the tensor after.
fn run_store(
    t: &Tensor,
    c: &Case,
    src: &[u8],
    op: Option<&str>,
    tile: Option<[u32; 5]>,
) -> Vec<u8> {
    let rank = t.dims.len();
    let mode = if tile.is_some() {
        "tile"
    } else {
        "im2col_no_offs"
    };
    let text = store_kernel(rank, op, mode);
    ptxas(&text);
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let g = mem.alloc(t.data.len() as u64, 0).unwrap();
    g.write_bytes(0, &t.data);
    let im = if tile.is_some() {
        None
    } else {
        Some(c.p.clone())
    };
    let mut d = t.desc(g.base, c.swizzle, im);
    if let Some(b) = tile {
        d.box_dims = b;
    }
    for (s, &st) in c.strides.iter().enumerate() {
        d.elem_strides[1 + s] = st;
    }
    let tm = mem.alloc(128, 0).unwrap();
    tm.write_bytes(0, &d.to_bytes());
    let bytes = d.box_bytes();
    let s = mem.alloc(bytes, 0).unwrap();
    s.write_bytes(0, src);
    let mut words = vec![bytes as i64];
    words.extend((0..5).map(|i| c.coords.get(i).copied().unwrap_or(0)));
    let cfg = LaunchConfig {
        shared_bytes: bytes as u32,
        ..LaunchConfig::linear(1, 128)
    };
    let p = params(&[tm.base, s.base], &words);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e} ({op:?}, {c:?})"));
    let mut o = vec![0u8; t.data.len()];
    g.read_bytes(0, &mut o);
    o
}

/// The tensor after storing (`op` None) or reducing the box `src` (swizzled shared-memory
/// bytes) at the pixels of `c` without offsets.
fn store_ref(t: &Tensor, c: &Case, src: &[u8], op: Option<&str>) -> Vec<u8> {
    let es = t.dtype.size() as usize;
    let cpp = c.p.channels_per_pixel as usize;
    let mut out = t.data.clone();
    let c0 = Case {
        offsets: vec![],
        ..c.clone()
    };
    for (pix, px) in pixels(t, &c0).into_iter().enumerate() {
        for (ch, idx) in px.into_iter().enumerate() {
            let Some(idx) = idx else { continue };
            let o = swz(c.swizzle, ((pix * cpp + ch) * es) as u64) as usize;
            let g = t.offset(&idx).unwrap();
            let mut v = [0u8; 8];
            v[..es].copy_from_slice(&src[o..o + es]);
            let mut old = [0u8; 8];
            old[..es].copy_from_slice(&out[g..g + es]);
            let new = match op {
                Some(op) => reduce_ref(op, t.dtype, u64::from_le_bytes(old), u64::from_le_bytes(v)),
                None => u64::from_le_bytes(v),
            };
            out[g..g + es].copy_from_slice(&new.to_le_bytes()[..es]);
        }
    }
    out
}

/// A random box of `bytes` bytes of elements of `ty`.
fn random_box(rg: &mut StdRng, ty: TmaType, bytes: usize) -> Vec<u8> {
    let es = ty.size() as usize;
    (0..bytes / es)
        .flat_map(|_| random_elem(rg, ty).to_le_bytes()[..es].to_vec())
        .collect()
}

#[test]
fn im2col_no_offs_stores_write_the_in_bounds_pixels() {
    let mut rg = StdRng::seed_from_u64(19);
    for rank in 3..=5 {
        let (mut t, c) = random_case(&mut rg, rank);
        let src = random_box(
            &mut rg,
            t.dtype,
            c.p.pixels_per_column as usize
                * c.p.channels_per_pixel as usize
                * t.dtype.size() as usize,
        );
        // poison the destination: what the store does not write stays 0xff
        t.data.iter_mut().for_each(|b| *b = 0xff);
        let got = run_store(&t, &c, &src, None, None);
        assert_eq!(got, store_ref(&t, &c, &src, None), "rank {rank}, {c:?}");
    }
}

/// Every (operation, element type) pair `cp.reduce.async.bulk.tensor` defines, `.im2col_no_offs`
/// on a random 3d-5d map and `.tile` on a 3d box.
#[test]
fn tensor_reductions_every_op_and_type() {
    use TmaType as T;
    let pairs: &[(&str, &[TmaType])] = &[
        ("add", &[T::U32, T::I32, T::U64, T::F32, T::F16, T::Bf16]),
        ("min", &[T::U32, T::I32, T::U64, T::I64, T::F16, T::Bf16]),
        ("max", &[T::U32, T::I32, T::U64, T::I64, T::F16, T::Bf16]),
        ("inc", &[T::U32]),
        ("dec", &[T::U32]),
        ("and", &[T::U32, T::I32, T::U64, T::I64]),
        ("or", &[T::U32, T::I32, T::U64, T::I64]),
        ("xor", &[T::U32, T::I32, T::U64, T::I64]),
    ];
    let mut rg = StdRng::seed_from_u64(20);
    for &(op, tys) in pairs {
        for &ty in tys {
            let rank = rg.gen_range(3..=5);
            let (t0, mut c) = random_case(&mut rg, rank);
            let es = ty.size();
            c.p.channels_per_pixel = 16 * rg.gen_range(1..=2) / es;
            c.swizzle = Swizzle::None;
            let t = Tensor::random(&mut rg, ty, t0.dims.clone());
            let bytes =
                c.p.pixels_per_column as usize * c.p.channels_per_pixel as usize * es as usize;
            let mut src = random_box(&mut rg, ty, bytes);
            if op == "inc" || op == "dec" {
                // small limits so both wrap-around branches happen
                for w in src.chunks_mut(4) {
                    w.copy_from_slice(&rg.gen_range(0u32..1u32 << 31).to_le_bytes());
                }
            }
            let got = run_store(&t, &c, &src, Some(op), None);
            assert_eq!(
                got,
                store_ref(&t, &c, &src, Some(op)),
                "{op} {ty:?} im2col_no_offs"
            );
        }
    }
    // `.tile` reductions: the box at random coordinates of a 3d tensor, straddling its edges
    for (op, ty) in [
        ("add", T::F32),
        ("max", T::I32),
        ("xor", T::U64),
        ("min", T::Bf16),
    ] {
        let t = Tensor::random(&mut rg, ty, vec![16, 5, 3]);
        let es = ty.size() as usize;
        let bx = [(16 / es) as u32 * 2, 4, 2, 1, 1];
        let coords = vec![
            rg.gen_range(-4..8),
            rg.gen_range(-2..3),
            rg.gen_range(-1..2),
        ];
        let src = random_box(&mut rg, ty, bx.iter().product::<u32>() as usize * es);
        let c = Case {
            p: Im2colParams::default(),
            strides: vec![1, 1],
            coords: coords.clone(),
            offsets: vec![],
            swizzle: Swizzle::None,
        };
        let got = run_store(&t, &c, &src, Some(op), Some(bx));
        let mut want = t.data.clone();
        for z in 0..bx[2] as i64 {
            for y in 0..bx[1] as i64 {
                for x in 0..bx[0] as i64 {
                    let Some(g) = t.offset(&[coords[0] + x, coords[1] + y, coords[2] + z]) else {
                        continue;
                    };
                    let o = (((z * bx[1] as i64 + y) * bx[0] as i64 + x) as usize) * es;
                    let mut v = [0u8; 8];
                    v[..es].copy_from_slice(&src[o..o + es]);
                    let mut old = [0u8; 8];
                    old[..es].copy_from_slice(&want[g..g + es]);
                    let r = reduce_ref(op, ty, u64::from_le_bytes(old), u64::from_le_bytes(v));
                    want[g..g + es].copy_from_slice(&r.to_le_bytes()[..es]);
                }
            }
        }
        assert_eq!(got, want, "{op} {ty:?} tile");
    }
}

/// A tile-mode copy through an im2col map, an im2col copy through a tiled map and a reduction
/// the element type does not define are faults that say so.
#[test]
fn mode_and_type_mismatches_are_faults() {
    let mut rg = StdRng::seed_from_u64(21);
    let (t, c) = random_case(&mut rg, 3);
    let text = store_kernel(3, Some("add"), "tile");
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let g = mem.alloc(t.data.len() as u64, 0).unwrap();
    let tm = mem.alloc(128, 0).unwrap();
    tm.write_bytes(
        0,
        &t.desc(g.base, Swizzle::None, Some(c.p.clone())).to_bytes(),
    );
    let s = mem.alloc(4096, 0).unwrap();
    let p = params(&[tm.base, s.base], &[16, 0, 0, 0, 0, 0]);
    let cfg = LaunchConfig {
        shared_bytes: 4096,
        ..LaunchConfig::linear(1, 32)
    };
    let e = launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p.clone(),
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tile-mode tensor copy through an im2col tensor map"),
        "{e}"
    );
    let text = store_kernel(3, Some("inc"), "im2col_no_offs");
    let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
    let mut f = Tensor::random(&mut rg, TmaType::F32, t.dims.clone()).desc(
        g.base,
        Swizzle::None,
        Some(c.p.clone()),
    );
    f.box_dims = [1; 5];
    tm.write_bytes(0, &f.to_bytes());
    let e = launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p.clone(),
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not defined on tensor maps of .f32"), "{e}");
    tm.write_bytes(0, &t.desc(g.base, Swizzle::None, None).to_bytes());
    let e = launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("im2col tensor copy through a tiled tensor map"),
        "{e}"
    );
}

const REPLACE: &str = r#"
.version 8.3
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.shared .align 128 .b8 tmap_s[128];
.visible .entry k(.param .u64 src_map, .param .u64 gmap, .param .u64 out, .param .u64 addr, .param .u64 stride, .param .u32 d0, .param .u32 d1, .param .u32 b1, .param .u32 c0, .param .u32 c1, .param .u32 bytes)
{
    .reg .pred %p<4>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<20>;
    ld.param.u64 %rd1, [src_map];
    ld.param.u64 %rd2, [gmap];
    ld.param.u64 %rd3, [out];
    ld.param.u64 %rd4, [addr];
    ld.param.u64 %rd5, [stride];
    ld.param.u32 %r21, [d0];
    ld.param.u32 %r22, [d1];
    ld.param.u32 %r23, [b1];
    ld.param.u32 %r24, [c0];
    ld.param.u32 %r25, [c1];
    ld.param.u32 %r20, [bytes];
    mov.u32 %r1, %tid.x;
    // the map to shared memory, 8 bytes per thread
    setp.lt.u32 %p1, %r1, 16;
    mul.wide.u32 %rd6, %r1, 8;
    add.s64 %rd7, %rd1, %rd6;
    @%p1 ld.global.b64 %rd8, [%rd7];
    mov.u32 %r2, tmap_s;
    shl.b32 %r3, %r1, 3;
    add.u32 %r4, %r2, %r3;
    @%p1 st.shared.b64 [%r4], %rd8;
    bar.sync 0;
    setp.eq.u32 %p2, %r1, 0;
    @!%p2 bra FENCE;
    tensormap.replace.tile.global_address.shared::cta.b1024.b64 [tmap_s], %rd4;
    tensormap.replace.tile.rank.shared::cta.b1024.b32 [tmap_s], 1;
    tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [tmap_s], 0, %r21;
    tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [tmap_s], 1, %r22;
    tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [tmap_s], 0, %rd5;
    tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [tmap_s], 0, 64;
    tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [tmap_s], 1, %r23;
    tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [tmap_s], 0, 1;
    tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [tmap_s], 1, 1;
    tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [tmap_s], 10;
    tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [tmap_s], 0;
    tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [tmap_s], 3;
    tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [tmap_s], 0;
FENCE:
    bar.sync 0;
    setp.lt.u32 %p3, %r1, 32;
    @!%p3 bra ACQ;
    tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.SCOPE.sync.aligned [%rd2], [tmap_s], 128;
    // one more field in place in global memory: NaN fill
    @%p2 tensormap.replace.tile.fill_mode.global.b1024.b32 [%rd2], 1;
    @%p2 fence.proxy.tensormap::generic.release.gpu;
ACQ:
    bar.sync 0;
    fence.proxy.tensormap::generic.acquire.SCOPE [%rd2], 128;
    // a TMA load through the rewritten map
    mov.u32 %r5, smem;
    add.u32 %r6, %r5, %r20;
    @%p2 mbarrier.init.shared::cta.b64 [%r6], 1;
    bar.sync 0;
    @%p2 mbarrier.arrive.expect_tx.shared::cta.b64 %rd9, [%r6], %r20;
    @%p2 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r5], [%rd2, {%r24, %r25}], [%r6];
W:
    mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r6], 0;
    @!%p1 bra W;
    shl.b32 %r7, %r1, 2;
L:
    setp.ge.u32 %p1, %r7, %r20;
    @%p1 bra DONE;
    add.u32 %r8, %r5, %r7;
    ld.shared.u32 %r9, [%r8];
    cvt.u64.u32 %rd10, %r7;
    add.s64 %rd11, %rd3, %rd10;
    st.global.u32 [%rd11], %r9;
    add.u32 %r7, %r7, 512;
    bra L;
DONE:
    ret;
}
"#;

/// A kernel copies an f32 3d tensor map to shared memory, rewrites every field there to make
/// it a 2d bf16 map with 128-byte swizzle over another tensor, copies it back to global memory
/// with `tensormap.cp_fenceproxy`, switches it to NaN fill in global memory, and loads a box
/// through it: the map bytes and the box match the host's.
#[test]
fn tensormap_replace_then_load_through_the_new_map() {
    let mut rg = StdRng::seed_from_u64(22);
    for scope in ["cta", "cluster", "gpu", "sys"] {
        let text = REPLACE.replace("SCOPE", scope);
        ptxas(&text);
        let old = Tensor::random(&mut rg, TmaType::F32, vec![12, 5, 3]);
        let (d0, d1) = (rg.gen_range(40..100u64), rg.gen_range(10..30u64));
        let t = Tensor::random(&mut rg, TmaType::Bf16, vec![d0, d1]);
        let b1 = rg.gen_range(4..16u32);
        let (c0, c1) = (rg.gen_range(-8..d0 as i64), rg.gen_range(-4..d1 as i64));
        let mem = GlobalMemory::new();
        let m = LoadedModule::load(&mem, ptx::parse(&text).unwrap(), 0).unwrap();
        let go = mem.alloc(old.data.len() as u64, 0).unwrap();
        let g = mem.alloc(t.data.len() as u64, 0).unwrap();
        g.write_bytes(0, &t.data);
        let mut src = old.desc(go.base, Swizzle::None, None);
        src.box_dims = [4, 2, 2, 1, 1];
        let sm = mem.alloc(128, 0).unwrap();
        sm.write_bytes(0, &src.to_bytes());
        let gm = mem.alloc(128, 0).unwrap();
        gm.fill(0, 128, &[0x5a]);
        let bytes = 64 * 2 * b1 as u64;
        let out = mem.alloc(bytes, 0).unwrap();
        out.fill(0, bytes, &[0xee]);
        let mut p = params(&[sm.base, gm.base, out.base, g.base, t.strides[0]], &[]);
        for w in [d0 as i64, d1 as i64, b1 as i64, c0, c1, bytes as i64] {
            p.extend_from_slice(&(w as i32).to_le_bytes());
        }
        let cfg = LaunchConfig {
            shared_bytes: bytes as u32 + 16,
            ..LaunchConfig::linear(1, 128)
        };
        launch(
            m.kernel("k").unwrap(),
            mem.snapshot(),
            p,
            &cfg,
            &LaunchOptions::default(),
        )
        .unwrap();
        // the map in global memory: the old one with every field replaced
        let mut raw = [0u8; 128];
        gm.read_bytes(0, &mut raw);
        let mut want_map = t.desc(g.base, Swizzle::B128, None);
        want_map.box_dims = [64, b1, 2, 1, 1]; // dims 2.. keep the old map's values
        want_map.dims[2] = 3;
        want_map.strides[1] = old.strides[1];
        want_map.oob_nan = true;
        assert_eq!(TensorMapDesc::from_bytes(&raw).unwrap(), want_map);
        let mut o = vec![0u8; bytes as usize];
        out.read_bytes(0, &mut o);
        for y in 0..b1 as i64 {
            for x in 0..64i64 {
                let s = swz(Swizzle::B128, ((y * 64 + x) * 2) as u64) as usize;
                let got = u16::from_le_bytes([o[s], o[s + 1]]);
                match t.offset(&[c0 + x, c1 + y]) {
                    Some(e) => assert_eq!(got, u16::from_le_bytes([t.data[e], t.data[e + 1]])),
                    None => assert!(bf16::from_bits(got).is_nan(), "({x}, {y}) fill {got:#x}"),
                }
            }
        }
    }
}
