//! The warp-wide `cp.async` fast path (`exec/fastmem.rs`: one checking pass over the lanes,
//! then the stores) and the constant-element-size vector `ld`/`st` and two-part unpack paths
//! against a host reference on fresh random inputs. Rows of 4, 8 and 16 bytes land in permuted
//! shared rows of a full and a partial warp, some threads predicated off or every thread
//! copying (the full-warp check), src-size 0 or the
//! whole row (the fast path), or any size in between (the per-lane path, which zero-fills the
//! rest), sources in one allocation or alternating between two (per-lane path). Shared rows are
//! read back as `v2.u64`, `v4.u16`, `v4.u8`, sign-extended `v2.s8` and unpacked words (some
//! predicated off). Outputs start poisoned. Faults keep their lane: a source row one row past
//! its allocation in one lane reports `OutOfBounds` for that thread, a destination 2 bytes off
//! in one lane `Misaligned` for that thread.

use emu::{launch, FaultKind, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

#[path = "common/load.rs"]
mod load;

/// Threads per CTA (a full and a partial warp) and CTAs (more than the workers hold at once,
/// so later CTAs reuse earlier ones' shared memory and register files).
const BLOCK: usize = 48;
const GRID: usize = 6;
const N: usize = BLOCK * GRID;
/// Rows of each source buffer.
const ROWS: usize = 64;
/// Output bytes per thread: the 16-byte shared row as `v2.u64`, then 16 bytes of narrow
/// loads, then 8 bytes of unpacked words and 8 bytes no store touches (they stay poisoned).
const OUT: usize = 48;

/// The kernel copying `s`-byte rows: thread `t` of CTA `c` copies source row
/// `(5 t + 11 c) % ROWS` of `a` (of `b` for odd `t` when `two` is set) into shared row
/// `(7 t + 3) % BLOCK` with src-size `sz[g]` (threads with `t % 5 == 4` skip when `skip`
/// is set, else whole warps copy), then writes
/// its own shared row `t` out. `sh` is added to the source address of thread `t == bad_t`
/// (byte offset) and `dsh` to its destination.
fn kernel(s: usize) -> String {
    format!(
        r#"
.version 8.0
.target sm_90a
.address_size 64
.shared .align 16 .b8 sbuf[{sbytes}];
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 psz, .param .u64 po,
    .param .u32 two, .param .u32 bad_t, .param .u32 sh, .param .u32 dsh, .param .u32 skip)
{{
    .reg .pred %p<6>;
    .reg .b16 %rs<12>;
    .reg .b32 %r<48>;
    .reg .b64 %rd<32>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [psz];
    ld.param.u64 %rd4, [po];
    ld.param.u32 %r1, [two];
    ld.param.u32 %r2, [bad_t];
    ld.param.u32 %r3, [sh];
    ld.param.u32 %r40, [dsh];
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %ctaid.x;
    mad.lo.u32 %r6, %r5, {block}, %r4;
    // source row (5 t + 11 c) % ROWS, from b for odd t when `two`
    mul.lo.u32 %r7, %r4, 5;
    mad.lo.u32 %r7, %r5, 11, %r7;
    rem.u32 %r7, %r7, {rows};
    mul.wide.u32 %rd5, %r7, {s};
    and.b32 %r8, %r4, 1;
    and.b32 %r8, %r8, %r1;
    setp.ne.u32 %p1, %r8, 0;
    selp.b64 %rd6, %rd2, %rd1, %p1;
    add.s64 %rd7, %rd6, %rd5;
    setp.eq.u32 %p2, %r4, %r2;
    selp.u32 %r9, %r3, 0, %p2;
    selp.u32 %r41, %r40, 0, %p2;
    cvt.u64.u32 %rd8, %r9;
    add.s64 %rd7, %rd7, %rd8;
    // destination shared row (7 t + 3) % BLOCK
    mul.lo.u32 %r10, %r4, 7;
    add.u32 %r10, %r10, 3;
    rem.u32 %r10, %r10, {block};
    mov.u32 %r11, sbuf;
    mad.lo.u32 %r12, %r10, 16, %r11;
    add.u32 %r12, %r12, %r41;
    // src-size sz[g]; threads with t % 5 == 4 skip the copy when `skip` is set
    mul.wide.u32 %rd9, %r6, 4;
    add.s64 %rd9, %rd3, %rd9;
    ld.global.u32 %r13, [%rd9];
    ld.param.u32 %r42, [skip];
    rem.u32 %r14, %r4, 5;
    setp.ne.u32 %p3, %r14, 4;
    setp.eq.or.u32 %p3, %r42, 0, %p3;
    @%p3 cp.async.ca.shared.global [%r12], [%rd7], {s}, %r13;
    cp.async.commit_group;
    cp.async.wait_group 0;
    bar.sync 0;
    // own shared row t: 16 bytes as v2.u64
    mad.lo.u32 %r15, %r4, 16, %r11;
    ld.shared.v2.u64 {{%rd10, %rd11}}, [%r15];
    mul.wide.u32 %rd12, %r6, {out};
    add.s64 %rd13, %rd4, %rd12;
    st.global.v2.u64 [%rd13], {{%rd10, %rd11}};
    // bytes 0..8 as v4.u16, 8..12 as v4.u8, 12..14 sign-extended v2.s8 (as 16-bit values)
    ld.shared.v4.u16 {{%rs1, %rs2, %rs3, %rs4}}, [%r15];
    st.global.v4.u16 [%rd13+16], {{%rs1, %rs2, %rs3, %rs4}};
    ld.shared.v4.u8 {{%rs5, %rs6, %rs7, %rs8}}, [%r15+8];
    st.global.v4.u8 [%rd13+24], {{%rs5, %rs6, %rs7, %rs8}};
    ld.shared.v2.s8 {{%rs9, %rs10}}, [%r15+12];
    st.global.v2.u16 [%rd13+28], {{%rs9, %rs10}};
    // the row's last word split in two (odd threads; even ones keep 0x1111 0x2222)
    mov.u32 %r20, 0x1111;
    mov.u32 %r21, 0x2222;
    and.b32 %r22, %r4, 1;
    setp.eq.u32 %p5, %r22, 1;
    @%p5 mov.b64 {{%r20, %r21}}, %rd11;
    st.global.v2.u32 [%rd13+32], {{%r20, %r21}};
    // dirty the row for a CTA that reuses this shared memory
    st.shared.u32 [%r15], %r6;
    ret;
}}
"#,
        sbytes = 16 * BLOCK,
        block = BLOCK,
        rows = ROWS,
        s = s,
        out = OUT,
    )
}

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

type Buf = Arc<emu::memory::Allocation>;

fn buf(mem: &GlobalMemory, bytes: &[u8]) -> Buf {
    let b = mem.alloc(bytes.len() as u64, 0).unwrap();
    b.write_bytes(0, bytes);
    b
}

fn bytes(b: &Buf, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    b.read_bytes(0, &mut v);
    v
}

fn module(mem: &GlobalMemory, text: &str) -> LoadedModule {
    load::load_checked(mem, text, &["sm_90a"], "warp_cp_async test PTX")
}

/// One launch's inputs: the two source buffers, src-sizes, and the test switches.
struct Case {
    s: usize,
    a: Vec<u8>,
    b: Vec<u8>,
    sz: Vec<u32>,
    two: bool,
    /// Threads with `t % 5 == 4` skip the copy (else every warp copies with all its lanes).
    skip: bool,
}

impl Case {
    fn new(r: &mut StdRng, s: usize, two: bool, partial: bool) -> Case {
        let mut rand_bytes = |n: usize| (0..n).map(|_| r.gen()).collect::<Vec<u8>>();
        let (a, b) = (rand_bytes(ROWS * s), rand_bytes(ROWS * s));
        let sz = (0..N)
            .map(|_| match r.gen_range(0..3) {
                0 => 0,
                1 if partial => r.gen_range(1..s as u32),
                _ => s as u32 + r.gen_range(0..3) * (s as u32),
            })
            .collect();
        Case {
            s,
            a,
            b,
            sz,
            two,
            skip: true,
        }
    }

    /// The host reference: `OUT` bytes per thread.
    fn reference(&self) -> Vec<u8> {
        let mut shared = vec![[0u8; 16]; N];
        for g in 0..N {
            let (t, c) = (g % BLOCK, g / BLOCK);
            if self.skip && t % 5 == 4 {
                continue;
            }
            let src = if self.two && t % 2 == 1 {
                &self.b
            } else {
                &self.a
            };
            let row = (5 * t + 11 * c) % ROWS;
            let n = (self.sz[g] as usize).min(self.s);
            let dst = &mut shared[c * BLOCK + (7 * t + 3) % BLOCK];
            dst[..n].copy_from_slice(&src[row * self.s..row * self.s + n]);
        }
        let mut out = Vec::with_capacity(N * OUT);
        for (g, row) in shared.iter().enumerate() {
            out.extend_from_slice(row);
            out.extend_from_slice(&row[..12]);
            for &x in &row[12..14] {
                out.extend_from_slice(&(x as i8 as i16).to_le_bytes());
            }
            if g % BLOCK % 2 == 1 {
                out.extend_from_slice(&row[8..16]);
            } else {
                out.extend_from_slice(&0x1111u32.to_le_bytes());
                out.extend_from_slice(&0x2222u32.to_le_bytes());
            }
            out.extend_from_slice(&[0xff; 8]);
        }
        out
    }

    /// Runs the kernel with thread `bad_t` (of every CTA) shifted by (`sh`, `dsh`) bytes.
    fn run(&self, bad: (u32, u32, u32)) -> Result<Vec<u8>, emu::EmuError> {
        let mem = GlobalMemory::new();
        let text = kernel(self.s);
        let m = module(&mem, &text);
        let sz: Vec<u8> = self.sz.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (ba, bb, bs) = (buf(&mem, &self.a), buf(&mem, &self.b), buf(&mem, &sz));
        let out = buf(&mem, &vec![0xff; N * OUT]);
        let mut params: Vec<u8> = [&ba, &bb, &bs, &out]
            .iter()
            .flat_map(|x| x.base.to_le_bytes())
            .collect();
        for v in [self.two as u32, bad.0, bad.1, bad.2, self.skip as u32] {
            params.extend(v.to_le_bytes());
        }
        let opts = LaunchOptions {
            threads: 2,
            ..Default::default()
        };
        let cfg = LaunchConfig::linear(GRID as u32, BLOCK as u32);
        launch(m.kernel("k").unwrap(), mem.snapshot(), params, &cfg, &opts)?;
        Ok(bytes(&out, N * OUT))
    }
}

fn check(case: &Case, what: &str) {
    let got = case
        .run((u32::MAX, 0, 0))
        .unwrap_or_else(|e| panic!("{what}: launch: {e}"));
    let want = case.reference();
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: thread {} byte {}: got {:#04x}, want {:#04x}",
            i / OUT,
            i % OUT,
            got[i],
            want[i]
        );
    }
}

#[test]
fn cp_async_rows_match_reference() {
    let mut r = rng();
    for s in [4, 8, 16] {
        for (two, partial) in [(false, false), (true, false), (false, true), (true, true)] {
            for skip in [true, false] {
                let mut case = Case::new(&mut r, s, two, partial);
                case.skip = skip;
                check(
                    &case,
                    &format!("{s}-byte rows, two {two}, partial {partial}, skip {skip}"),
                );
            }
        }
    }
}

#[test]
fn cp_async_faults_keep_their_lane() {
    let mut r = rng();
    let mut case = Case::new(&mut r, 16, false, false);
    // every thread reads its whole row, so thread 13's shifted source is read; whole warps
    // copy (the full-warp check)
    case.sz = vec![16; N];
    case.skip = false;
    // thread 13 reads source row (65 + 11 c) % 64: shifted by 64 rows minus that, it reads
    // row 64, one past the end
    let e = case
        .run((13, 16 * 63, 0))
        .expect_err("a source row past the end must fault");
    let s = e.to_string();
    assert!(
        matches!(
            e.fault(),
            Some(FaultKind::OutOfBounds {
                space: "global",
                ..
            })
        ),
        "{s}"
    );
    assert!(s.contains("thread (13,0,0)"), "{s}");
    // a destination 2 bytes off in thread 21
    let e = case
        .run((21, 0, 2))
        .expect_err("a misaligned destination must fault");
    let s = e.to_string();
    assert!(
        matches!(e.fault(), Some(FaultKind::Misaligned { .. })),
        "{s}"
    );
    assert!(s.contains("thread (21,0,0)"), "{s}");
}
