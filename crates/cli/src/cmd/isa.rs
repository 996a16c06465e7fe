//! `ptxforge isa [--json] [--missing]`: every instruction opcode the parser knows, with its
//! parse / validate / emulate / builder status. Nothing here is a hand-kept list: the opcodes and
//! their operand counts and targets come from the `ptx` instruction table, the emulator status
//! from the emulator's decoder dispatch ([`emu::coverage`]), and the builder status from the
//! builder's sources (an opcode counts as built when the builder crate names it).

use anyhow::Result;
use ptx::Opcode;

#[derive(clap::Args)]
pub struct Args {
    /// Emit one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    /// List only the opcodes the emulator cannot run.
    #[arg(long)]
    pub missing: bool,
}

/// The builder crate's sources, read at compile time.
const BUILDER_SOURCES: &[&str] = &[
    include_str!("../../../builder/src/lib.rs"),
    include_str!("../../../builder/src/kernel.rs"),
    include_str!("../../../builder/src/ops.rs"),
    include_str!("../../../builder/src/typed.rs"),
    include_str!("../../../builder/src/expr.rs"),
    include_str!("../../../builder/src/hopper.rs"),
    include_str!("../../../builder/src/ty.rs"),
];

/// Status of one opcode across the layers.
#[derive(serde::Serialize)]
pub struct Row {
    pub opcode: &'static str,
    /// The parser recognises the name (it matches the table by name).
    pub parse: bool,
    /// Operand counts and the target/ISA requirement the validator checks.
    pub operands: String,
    pub min_sm: u32,
    pub min_ptx: String,
    pub emulate: bool,
    pub families: Vec<&'static str>,
    pub int_types: Vec<String>,
    pub note: String,
    /// The builder crate emits it.
    pub builder: bool,
}

/// Does the builder's source name `Opcode::<variant>`?
fn builder_emits(op: Opcode) -> bool {
    let pat = format!("Opcode::{op:?}");
    BUILDER_SOURCES.iter().any(|s| {
        s.match_indices(&pat).any(|(i, _)| {
            !s[i + pat.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// The table for every opcode.
pub fn rows() -> Vec<Row> {
    Opcode::ALL
        .iter()
        .map(|&op| {
            let info = op.info();
            let cov = emu::coverage::opcode_coverage(op);
            Row {
                opcode: info.name,
                parse: Opcode::from_name(info.name) == Some(op),
                operands: format!(
                    "{} dst, {}..{} src",
                    info.dsts, info.min_srcs, info.max_srcs
                ),
                min_sm: info.min_sm,
                min_ptx: format!("{}.{}", info.min_ptx / 10, info.min_ptx % 10),
                emulate: cov.emulated,
                families: cov.families,
                int_types: cov.int_types,
                note: cov.note,
                builder: builder_emits(op),
            }
        })
        .collect()
}

pub fn run(a: Args) -> Result<()> {
    let rows: Vec<Row> = rows()
        .into_iter()
        .filter(|r| !a.missing || !r.emulate)
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let yn = |b: bool| if b { "yes" } else { "no" };
    println!(
        "{:<30} {:>5} {:>6} {:>5} {:>7} {:<24} {:>7}  note",
        "opcode", "parse", "min_sm", "ptx", "emulate", "family", "builder"
    );
    for r in &rows {
        let mut note = r.note.clone();
        if !r.int_types.is_empty() {
            note = format!("integer types: {}", r.int_types.join(" "));
        }
        println!(
            "{:<30} {:>5} {:>6} {:>5} {:>7} {:<24} {:>7}  {note}",
            r.opcode,
            yn(r.parse),
            r.min_sm,
            r.min_ptx,
            yn(r.emulate),
            r.families.join(", "),
            yn(r.builder),
        );
    }
    let n = rows.len();
    let count = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
    println!(
        "{n} opcodes: {} parsed, {} emulated, {} emitted by the builder (validation: operand \
         counts and target for all)",
        count(&|r| r.parse),
        count(&|r| r.emulate),
        count(&|r| r.builder)
    );
    Ok(())
}
