//! What each generated block of the documents holds, computed in-process from the libraries:
//! the crate graph (from the crates' Cargo.toml files), kernel registers and spills per target
//! (`kernels::registry()` through `ptxas`), the `kernels --check` list, pipeline schedule bubbles
//! and the `schedule --json` example, the simulator presets, and the expert-parallel record sizes
//! and kernel registers.
//!
//! Everything here is deterministic (fixed seeds, no timings), so a block differs from the code's
//! output only when one of them changed. The main job's (`moe`) byte counts are not generated:
//! they come from the routing of its random inputs on 8 emulated devices (the device gate GEMM
//! and routing kernels), which only the job itself computes, in minutes; docs/EP.md quotes them
//! as measured.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// A generated block: its name (the marker's NAME) and what produces it.
pub struct Generator {
    pub name: &'static str,
    generate: fn(&Path) -> Result<String>,
}

/// Every generator; a name appears in the documents as `<!-- generated: NAME ... -->`.
pub const GENERATORS: &[Generator] = &[
    Generator {
        name: "crate-graph",
        generate: crate_graph,
    },
    Generator {
        name: "kernel-registers",
        generate: kernel_registers,
    },
    Generator {
        name: "kernel-checks",
        generate: kernel_checks,
    },
    Generator {
        name: "schedule-bubbles",
        generate: schedule_bubbles,
    },
    Generator {
        name: "schedule-json",
        generate: schedule_json,
    },
    Generator {
        name: "sim-presets",
        generate: sim_presets,
    },
    Generator {
        name: "ep-records",
        generate: ep_records,
    },
    Generator {
        name: "ep-registers",
        generate: ep_registers,
    },
];

/// The known names, for error messages.
pub fn names() -> String {
    GENERATORS
        .iter()
        .map(|g| g.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each generator's output, computed at most once per run (a block may appear in several
/// documents).
pub struct Cache {
    root: PathBuf,
    done: BTreeMap<&'static str, String>,
}

impl Cache {
    pub fn new(root: &Path) -> Cache {
        Cache {
            root: root.to_path_buf(),
            done: BTreeMap::new(),
        }
    }

    pub fn get(&mut self, name: &str) -> Result<&str> {
        let g = GENERATORS
            .iter()
            .find(|g| g.name == name)
            .ok_or_else(|| anyhow!("unknown block `{name}`"))?;
        if !self.done.contains_key(g.name) {
            let text = (g.generate)(&self.root).with_context(|| format!("block `{name}`"))?;
            self.done.insert(g.name, text);
        }
        Ok(&self.done[g.name])
    }
}

/// `x` with at most 4 decimals, trailing zeros removed (2.5, 63.9, 9.3).
fn num(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// `n` with thousands separators.
fn thousands(n: u64) -> String {
    let d = n.to_string();
    let mut groups = Vec::new();
    let mut end = d.len();
    while end > 3 {
        groups.push(&d[end - 3..end]);
        end -= 3;
    }
    groups.push(&d[..end]);
    groups.reverse();
    groups.join(",")
}

// ---------------------------------------------------------------------------------------------
// Crate graph
// ---------------------------------------------------------------------------------------------

/// One workspace crate: its directory, package name and workspace dependencies.
struct CrateDeps {
    dir: String,
    name: String,
    deps: Vec<String>,
    dev: Vec<String>,
}

fn read_toml(path: &Path) -> Result<toml::Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.parse::<toml::Table>()
        .with_context(|| format!("parsing {}", path.display()))
}

/// Names of the workspace crates among a `[dependencies]`-style table: a `path` dependency, or
/// `workspace = true` where the workspace's entry has a path.
fn internal_deps(table: Option<&toml::Value>, ws: &toml::Table) -> Vec<String> {
    let Some(t) = table.and_then(|t| t.as_table()) else {
        return Vec::new();
    };
    let mut v: Vec<String> = t
        .iter()
        .filter_map(|(key, spec)| {
            let spec = spec.as_table()?;
            let via_ws = spec.get("workspace").and_then(|w| w.as_bool()) == Some(true);
            let entry = if via_ws {
                ws.get(key)?.as_table()?
            } else {
                spec
            };
            entry.get("path")?;
            let pkg = entry.get("package").and_then(|p| p.as_str()).unwrap_or(key);
            Some(pkg.to_string())
        })
        .collect();
    v.sort();
    v
}

fn workspace_crates(root: &Path) -> Result<Vec<CrateDeps>> {
    let top = read_toml(&root.join("Cargo.toml"))?;
    let empty = toml::Table::new();
    let ws = top
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(|d| d.as_table())
        .unwrap_or(&empty);
    let mut dirs = member_dirs(root, &top)?;
    dirs.sort();
    dirs.iter()
        .map(|d| {
            let t = read_toml(&d.join("Cargo.toml"))?;
            let name = t
                .get("package")
                .and_then(|p| p.get("name"))
                .and_then(|n| n.as_str())
                .ok_or_else(|| anyhow!("{}: no package name", d.display()))?;
            let deps = internal_deps(t.get("dependencies"), ws);
            let dev = internal_deps(t.get("dev-dependencies"), ws)
                .into_iter()
                .filter(|n| !deps.contains(n))
                .collect();
            let dir = d
                .strip_prefix(root)
                .unwrap_or(d)
                .to_string_lossy()
                .into_owned();
            Ok(CrateDeps {
                dir,
                name: name.to_string(),
                deps,
                dev,
            })
        })
        .collect()
}

/// The directories of the workspace's members (`[workspace] members`: plain paths and `dir/*`
/// globs), those with a `Cargo.toml`.
fn member_dirs(root: &Path, top: &toml::Table) -> Result<Vec<PathBuf>> {
    let members = top
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .ok_or_else(|| anyhow!("Cargo.toml: no [workspace] members"))?;
    let mut dirs = Vec::new();
    for m in members.iter().filter_map(|m| m.as_str()) {
        match m.strip_suffix("/*") {
            Some(parent) => {
                let entries = std::fs::read_dir(root.join(parent))
                    .with_context(|| format!("reading {parent}/"))?;
                dirs.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
            }
            None => dirs.push(root.join(m)),
        }
    }
    dirs.retain(|p| p.join("Cargo.toml").is_file());
    Ok(dirs)
}

/// Layer of each crate: 0 without workspace dependencies, else one above its highest
/// dependency. A cycle is an error.
fn layers(crates: &[CrateDeps]) -> Result<BTreeMap<String, usize>> {
    let mut layer: BTreeMap<String, usize> = BTreeMap::new();
    while layer.len() < crates.len() {
        let before = layer.len();
        let ready: Vec<(String, usize)> = crates
            .iter()
            .filter(|c| !layer.contains_key(&c.name))
            .filter_map(|c| {
                let ls: Option<Vec<usize>> = c.deps.iter().map(|d| layer.get(d).copied()).collect();
                Some((c.name.clone(), ls?.iter().map(|l| l + 1).max().unwrap_or(0)))
            })
            .collect();
        layer.extend(ready);
        if layer.len() == before {
            bail!("the workspace crates' dependencies form a cycle");
        }
    }
    Ok(layer)
}

fn crate_graph(root: &Path) -> Result<String> {
    let crates = workspace_crates(root)?;
    let layer = layers(&crates)?;
    let mut order: Vec<&CrateDeps> = crates.iter().collect();
    order.sort_by_key(|c| (layer[&c.name], c.name.clone()));
    let code = |v: &[String]| {
        v.iter()
            .map(|d| format!("`{d}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = String::from(
        "| layer | crate | directory | depends on (workspace crates) | tests also use |\n\
         |---|---|---|---|---|\n",
    );
    for c in order {
        let _ = writeln!(
            s,
            "| {} | `{}` | `{}` | {} | {} |",
            layer[&c.name],
            c.name,
            c.dir,
            code(&c.deps),
            code(&c.dev)
        );
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Kernel library
// ---------------------------------------------------------------------------------------------

/// Targets in ascending SM order (sm_80, sm_89, sm_90a).
fn targets_of(reg: &[kernels::KernelInfo]) -> Vec<&'static str> {
    let mut t: Vec<&'static str> = Vec::new();
    for k in reg {
        for a in k.targets {
            if !t.contains(a) {
                t.push(a);
            }
        }
    }
    t.sort_by_key(|a| (a.trim_start_matches("sm_").to_string(), a.len()));
    t
}

fn fmt_shared(bytes: u64) -> String {
    match bytes {
        0 => String::new(),
        b if b < 1024 => format!("{b} B"),
        b => format!("{} KiB", num(b as f64 / 1024.0)),
    }
}

/// One registry kernel assembled for one target: "regs" or "regs, spills N B", and static shared
/// bytes.
fn assemble_cell(k: &kernels::KernelInfo, arch: &str) -> Result<(String, u64, bool)> {
    let t = builder::Target::new(arch);
    let m = k.generate(&t, &k.test_shapes[0])?;
    let rep = ptx::ptxas::assemble(&ptx::print(&m), arch, &Default::default())?;
    let r = rep
        .kernel(&k.name)
        .ok_or_else(|| anyhow!("ptxas reported no kernel `{}` for {arch}", k.name))?;
    let spill = r.spill_stores_bytes + r.spill_loads_bytes + r.stack_frame_bytes;
    let cell = if spill > 0 {
        format!(
            "{}, spills {}/{} B, stack {} B",
            r.registers, r.spill_stores_bytes, r.spill_loads_bytes, r.stack_frame_bytes
        )
    } else {
        r.registers.to_string()
    };
    Ok((cell, r.shared_bytes, spill > 0))
}

fn kernel_registers(_root: &Path) -> Result<String> {
    let version = ptx::ptxas::ptxas_version()
        .context("ptxas is needed for the register table (scripts/setup-ptxas.sh)")?;
    let reg = kernels::registry();
    let targets = targets_of(reg);
    let mut s = format!(
        "| kernel | {} | static shared |\n|---|",
        targets.join(" | ")
    );
    s.push_str(&"---|".repeat(targets.len() + 1));
    s.push('\n');
    let (mut pairs, mut spilling) = (0, 0);
    for k in reg {
        let mut cells = Vec::new();
        let mut shared = 0;
        for a in &targets {
            if !k.targets.contains(a) {
                cells.push(String::new());
                continue;
            }
            let (cell, sh, spills) = assemble_cell(k, a)?;
            pairs += 1;
            spilling += spills as usize;
            shared = shared.max(sh);
            cells.push(cell);
        }
        let _ = writeln!(
            s,
            "| `{}` | {} | {} |",
            k.name,
            cells.join(" | "),
            fmt_shared(shared)
        );
    }
    let _ = write!(
        s,
        "\nRegisters per thread from `{version}`: {pairs} kernel x target pairs, {spilling} with \
         spills or a stack frame."
    );
    Ok(s)
}

fn kernel_checks(_root: &Path) -> Result<String> {
    let reg = kernels::registry();
    let targets = targets_of(reg);
    let emu_arch = kernels::host::target_for(&runtime::Device::emu(0)).arch;
    let mut s = String::from("| kernel | targets | test shapes (m,n,k,groups) |\n|---|---|---|\n");
    for k in reg {
        let shapes: Vec<String> = k
            .test_shapes
            .iter()
            .map(|x| format!("{},{},{},{}", x.m, x.n, x.k, x.groups))
            .collect();
        let _ = writeln!(
            s,
            "| `{}` | {} | {} |",
            k.name,
            k.targets.join(", "),
            shapes.join("; ")
        );
    }
    let counts: Vec<String> = targets
        .iter()
        .map(|a| {
            let (kn, checks) = reg
                .iter()
                .filter(|k| k.targets.contains(a))
                .fold((0, 0), |(n, c), k| (n + 1, c + k.test_shapes.len()));
            format!("{a}: {checks} checks of {kn} kernels")
        })
        .collect();
    let _ = write!(
        s,
        "\n{} kernels registered. `ptxforge kernels --check` runs one check per test shape of \
         every kernel built for the device's target ({}; the emulator is {emu_arch}).",
        reg.len(),
        counts.join(", ")
    );
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Pipeline schedules
// ---------------------------------------------------------------------------------------------

/// The costs the documents quote: the CLI's defaults, and the regime of DeepSeek's figure.
fn documented_costs() -> [(&'static str, pipeline::Costs); 2] {
    [
        (
            "defaults",
            pipeline::Costs {
                f: 1.0,
                b: 2.0,
                w: 0.5,
                fb: 2.6,
                p2p: 0.0,
            },
        ),
        (
            "DualPipe regime",
            pipeline::Costs {
                f: 1.0,
                b: 2.0,
                w: 1.0,
                fb: 3.0,
                p2p: 0.0,
            },
        ),
    ]
}

const METHODS: [pipeline::Method; 4] = [
    pipeline::Method::OneFOneB,
    pipeline::Method::Zb1p,
    pipeline::Method::DualPipe,
    pipeline::Method::DualPipeV,
];

fn schedule_bubbles(_root: &Path) -> Result<String> {
    let (pp, chunks) = (8, 20);
    let mut s = format!(
        "PP = {pp}, {chunks} micro-batches (`ptxforge schedule METHOD --pp {pp} --chunks {chunks} \
         [costs]`):\n\n\
         | method | costs (F, B, W, F&B) | devices | makespan | bubble (critical) | formula | \
         formula value | peak activations |\n|---|---|---|---|---|---|---|---|\n"
    );
    for (label, c) in documented_costs() {
        for m in METHODS {
            let sched = pipeline::generate(m, pp, chunks)?;
            let r = pipeline::Report::new(&sched, &c)?;
            let peak = r.peak_activations.iter().max().copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "| {} | {label}: {}, {}, {}, {} | {} | {} | {} | {} | {} | {peak} |",
                m.name(),
                num(c.f),
                num(c.b),
                num(c.w),
                num(c.fb),
                r.devices,
                num(r.makespan),
                num(r.bubble_max),
                r.bubble_formula_text,
                num(r.bubble_formula)
            );
        }
    }
    Ok(s)
}

/// `"key": value` as serde writes it (struct fields in declaration order, as `--json` does).
fn field(key: &str, v: &impl serde::Serialize) -> Result<String> {
    Ok(format!("\"{key}\": {}", serde_json::to_string(v)?))
}

/// `ptxforge schedule dualpipe --json` with the default flags, `ranks` cut to its first op.
fn schedule_json(_root: &Path) -> Result<String> {
    let (_, costs) = documented_costs()[0];
    let sched = pipeline::generate(pipeline::Method::DualPipe, 8, 20)?;
    let r = pipeline::Report::new(&sched, &costs)?;
    let first = r
        .ranks
        .first()
        .and_then(|ops| ops.first())
        .ok_or_else(|| anyhow!("the schedule has no op"))?;
    let lines = [
        [
            field("method", &r.method)?,
            field("pp", &r.pp)?,
            field("chunks", &r.chunks)?,
            field("devices", &r.devices)?,
        ]
        .join(", "),
        field("costs", &r.costs)?,
        format!("\"ranks\": [[{}, ...], ...]", serde_json::to_string(first)?),
        field("bubble", &r.bubble)?,
        [
            field("bubble_formula", &r.bubble_formula)?,
            field("bubble_formula_text", &r.bubble_formula_text)?,
        ]
        .join(", "),
        [
            field("bubble_max", &r.bubble_max)?,
            field("makespan", &r.makespan)?,
        ]
        .join(", "),
        field("busy", &r.busy)?,
        [
            field("peak_activations", &r.peak_activations)?,
            field("param_copies", &r.param_copies)?,
        ]
        .join(", "),
    ];
    Ok(format!(
        "```\n{{ {},\n  \"execute\": {{..}}   // only with --execute\n}}\n```",
        lines.join(",\n  ")
    ))
}

// ---------------------------------------------------------------------------------------------
// Simulator presets
// ---------------------------------------------------------------------------------------------

/// The presets `ptxforge sim` knows (`sim::Config::preset`).
const SIM_PRESETS: [&str; 2] = ["v3", "h200-node"];

fn sim_presets(_root: &Path) -> Result<String> {
    let mut s = String::new();
    for p in SIM_PRESETS {
        let cfg = sim::Config::preset(p)?;
        let r = sim::simulate(&cfg)?;
        let sw = sim::sweep(&cfg, 0, 40)?;
        let _ = writeln!(s, "`ptxforge sim {p}`:\n\n```\n{}```\n", r.text());
        let moe = r.layers.iter().find(|l| l.kind == "moe");
        let ratio = moe.map(|l| (l.attn_ms + l.moe_gemm_ms) / (l.dispatch_ms + l.combine_ms));
        let opt = |x: Option<usize>| x.map_or("none".to_string(), |v| v.to_string());
        let _ = writeln!(
            s,
            "`--sweep comm-sms=0..40`: knee at {} SMs (within 1% of the best step, at {} SMs); \
             {} SMs and fewer are not enough. Forward compute/communication time of an MoE \
             layer: {}.\n",
            opt(sw.knee_sms),
            opt(sw.best_sms),
            opt(sw.not_enough_below),
            ratio.map_or("n/a".to_string(), |r| format!("{r:.2}"))
        );
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Expert-parallel records
// ---------------------------------------------------------------------------------------------

fn ep_records(_root: &Path) -> Result<String> {
    use ep::comm::{EpConfig, Payload};
    let mut s = String::from(
        "| hidden, top-k | record | header + indices/weights/slots | payload | scales | bytes on \
         a link |\n|---|---|---|---|---|---|\n",
    );
    // The main job's default (2 x 4 devices, 64 experts) and the dispatch tests' size.
    for (ranks, gpn, experts, hidden, topk) in [(8, 4, 64, 1024, 8), (4, 2, 16, 256, 4)] {
        let c = EpConfig::new(ranks, gpn, experts, hidden, topk, 512);
        for (label, p) in [
            ("dispatch FP8", Payload::Fp8),
            ("dispatch BF16", Payload::Bf16),
        ] {
            let _ = writeln!(
                s,
                "| {hidden}, {topk} | {label} | {} | {} | {} | {} |",
                c.meta_bytes(),
                c.payload_bytes(p),
                c.scale_bytes(p),
                thousands(c.record_bytes(p) as u64)
            );
        }
        let _ = writeln!(
            s,
            "| {hidden}, {topk} | combine BF16 | {} | {} | 0 | {} |",
            c.combine_record_bytes() - 2 * hidden,
            2 * hidden,
            thousands(c.combine_record_bytes() as u64)
        );
    }
    Ok(s)
}

/// The expert-parallel kernels at the main job's default size (2 x 4 ranks, 64 experts in 8
/// groups, top-8 of 4 groups, hidden 1024), as `crates/ep/tests/ptxas.rs` assembles them.
fn ep_modules(t: &builder::Target) -> Result<Vec<(&'static str, &'static str, ptx::Module)>> {
    use ep::comm::{combine_kernel, dispatch_kernel, EpConfig, Payload};
    let cfg = EpConfig::new(8, 4, 64, 1024, 8, 512);
    let rc = ep::routing::RoutingCfg {
        experts: 64,
        groups: 8,
        topk_groups: 4,
        topk: 8,
        scaling: 2.5,
    };
    let lc = cfg.layout_cfg();
    Ok(vec![
        ("ep_route", "", ep::routing::route_kernel(t, &rc)?),
        ("ep_layout", "", ep::layout::layout_kernel(t, &lc)?),
        ("ep_slots", "", ep::layout::slots_kernel(t, &lc)?),
        (
            "ep_dispatch",
            "FP8",
            dispatch_kernel(t, &cfg, Payload::Fp8)?,
        ),
        (
            "ep_dispatch",
            "BF16",
            dispatch_kernel(t, &cfg, Payload::Bf16)?,
        ),
        ("ep_combine", "", combine_kernel(t, &cfg)?),
        (
            "ep_topk_grad",
            "",
            ep::grad::topk_grad_kernel(t, 1024, 8, 4)?,
        ),
        ("ep_route_bwd", "", ep::grad::route_bwd_kernel(t, &rc)?),
    ])
}

fn ep_registers(_root: &Path) -> Result<String> {
    let version = ptx::ptxas::ptxas_version()
        .context("ptxas is needed for the register table (scripts/setup-ptxas.sh)")?;
    let targets = ["sm_80", "sm_90a"];
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for (i, arch) in targets.iter().enumerate() {
        let t = builder::Target::new(arch);
        for (j, (name, variant, m)) in ep_modules(&t)?.into_iter().enumerate() {
            let rep = ptx::ptxas::assemble(&ptx::print(&m), arch, &Default::default())?;
            let r = rep
                .kernel(name)
                .ok_or_else(|| anyhow!("ptxas reported no kernel `{name}` for {arch}"))?;
            let spill = r.spill_stores_bytes + r.spill_loads_bytes + r.stack_frame_bytes;
            let cell = if spill > 0 {
                format!("{}, spills/stack {spill} B", r.registers)
            } else {
                r.registers.to_string()
            };
            if i == 0 {
                let label = if variant.is_empty() {
                    format!("`{name}`")
                } else {
                    format!("`{name}` ({variant})")
                };
                rows.push((label, Vec::new()));
            }
            rows[j].1.push(cell);
        }
    }
    let mut s = format!("| kernel | {} |\n|---|---|---|\n", targets.join(" | "));
    for (label, cells) in rows {
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    }
    let _ = write!(s, "\nRegisters per thread from `{version}`.");
    Ok(s)
}
