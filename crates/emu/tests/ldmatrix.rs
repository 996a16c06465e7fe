//! ldmatrix / stmatrix against the PTX fragment definition: lane l holds row l/4, columns
//! 2(l%4) and 2(l%4)+1 of matrix i in register i (low half first); `.trans` holds the transpose.
//! Row addresses come from lanes 8i..8i+7 and are scattered so any address mix-up fails.

use emu::{launch, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};

fn kernel(x: u32, trans: bool) -> String {
    let regs: Vec<String> = (0..x).map(|i| format!("%r{}", 10 + i)).collect();
    let t = if trans { ".trans" } else { "" };
    let mut st = String::new();
    for i in 0..x {
        st.push_str(&format!(
            "    st.global.u32 [%rd6+{}], %r{};\n",
            4 * i,
            10 + i
        ));
    }
    format!(
        r#".version 8.0
.target sm_90
.address_size 64
.shared .align 16 .b8 tile[4096];
.visible .entry lm(.param .u64 img, .param .u64 rowaddr, .param .u64 out, .param .u64 back)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [img];
    ld.param.u64 %rd2, [rowaddr];
    ld.param.u64 %rd3, [out];
    ld.param.u64 %rd9, [back];
    mov.u32 %r1, %tid.x;
    // copy the 4 KiB image into shared memory: 32 words per lane
    mov.u32 %r2, 0;
C:
    shl.b32 %r3, %r2, 5;
    add.u32 %r3, %r3, %r1;
    mul.wide.u32 %rd4, %r3, 4;
    add.s64 %rd5, %rd1, %rd4;
    ld.global.u32 %r4, [%rd5];
    shl.b32 %r5, %r3, 2;
    mov.u32 %r6, tile;
    add.u32 %r6, %r6, %r5;
    st.shared.u32 [%r6], %r4;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, 32;
    @%p1 bra C;
    bar.sync 0;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd2, %rd4;
    ld.global.u32 %r7, [%rd5];
    mov.u32 %r6, tile;
    add.u32 %r8, %r6, %r7;
    ldmatrix.sync.aligned.m8n8.x{x}{t}.shared.b16 {{{regs}}}, [%r8];
    mul.wide.u32 %rd7, %r1, {stride};
    add.s64 %rd6, %rd3, %rd7;
{st}    // write the fragments back to shared at the same addresses (stmatrix is ldmatrix's inverse)
    bar.sync 0;
    add.u32 %r9, %r8, 2048;
    stmatrix.sync.aligned.m8n8.x{x}{t}.shared.b16 [%r9], {{{regs}}};
    bar.sync 0;
    // copy the second half back out
    mov.u32 %r2, 0;
D:
    shl.b32 %r3, %r2, 5;
    add.u32 %r3, %r3, %r1;
    shl.b32 %r5, %r3, 2;
    add.u32 %r6, %r6, 0;
    mov.u32 %r6, tile;
    add.u32 %r6, %r6, %r5;
    ld.shared.u32 %r4, [%r6];
    mul.wide.u32 %rd4, %r3, 4;
    add.s64 %rd5, %rd9, %rd4;
    st.global.u32 [%rd5], %r4;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, 32;
    @%p1 bra D;
    ret;
}}
"#,
        regs = regs.join(", "),
        stride = 4 * x
    )
}

fn case(x: u32, trans: bool) {
    // Row r of matrix i lives at a scattered 16-byte-aligned offset in the first 2 KiB.
    let row_off = |i: usize, r: usize| -> usize { ((i * 8 + r) * 37 % 64) * 32 };
    let val = |i: usize, r: usize, c: usize| -> u16 { (i * 1000 + r * 10 + c + 1) as u16 };
    let mut img = vec![0u8; 4096];
    for i in 0..x as usize {
        for r in 0..8 {
            for c in 0..8 {
                let o = row_off(i, r) + 2 * c;
                img[o..o + 2].copy_from_slice(&val(i, r, c).to_le_bytes());
            }
        }
    }
    let mut rows = [0u32; 32];
    for (l, ro) in rows.iter_mut().enumerate() {
        let (i, r) = (l / 8, l % 8);
        // Lanes beyond the matrices still pass valid addresses.
        *ro = row_off(i.min(x as usize - 1), r) as u32;
    }
    let mem = GlobalMemory::new();
    let m = LoadedModule::load(&mem, ptx::parse(&kernel(x, trans)).unwrap(), 0).unwrap();
    let gi = mem.alloc(4096, 0).unwrap();
    gi.write_bytes(0, &img);
    let gr = mem.alloc(128, 0).unwrap();
    gr.write_bytes(
        0,
        &rows
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let out = mem.alloc(32 * 4 * x as u64, 0).unwrap();
    out.fill(0, 32 * 4 * x as u64, &[0xab]);
    let back = mem.alloc(4096, 0).unwrap();
    let mut p = Vec::new();
    for v in [gi.base, gr.base, out.base, back.base] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        sms: 1,
        sm_offset: 0,
        device_sms: 132,
        cluster: [1, 1, 1],
    };
    launch(
        m.kernel("lm").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .unwrap();
    let mut o = vec![0u8; 32 * 4 * x as usize];
    out.read_bytes(0, &mut o);
    for l in 0..32usize {
        for i in 0..x as usize {
            let w = u32::from_le_bytes(o[(l * x as usize + i) * 4..][..4].try_into().unwrap());
            let (lo, hi) = ((w & 0xffff) as u16, (w >> 16) as u16);
            let (r, c) = (l / 4, 2 * (l % 4));
            let (want_lo, want_hi) = if trans {
                (val(i, c, r), val(i, c + 1, r))
            } else {
                (val(i, r, c), val(i, r, c + 1))
            };
            assert_eq!(
                (lo, hi),
                (want_lo, want_hi),
                "x{x} trans={trans} lane {l} matrix {i}"
            );
        }
    }
    // stmatrix with the same addresses (+2048) must reproduce the original rows.
    let mut b = vec![0u8; 4096];
    back.read_bytes(0, &mut b);
    for i in 0..x as usize {
        for r in 0..8 {
            let o = row_off(i, r);
            assert_eq!(
                &b[2048 + o..2048 + o + 16],
                &img[o..o + 16],
                "stmatrix x{x} trans={trans} matrix {i} row {r}"
            );
        }
    }
}

#[test]
fn ldmatrix_and_stmatrix_all_forms() {
    for x in [1, 2, 4] {
        for trans in [false, true] {
            case(x, trans);
        }
    }
}
