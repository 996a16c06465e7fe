//! Drawing a timed schedule: an SVG and a PNG timeline in the style of DeepSeek's DualPipe
//! figure (devices as rows, one coloured block per pass, micro-batch numbers inside, an
//! overlapped F&B drawn as a block split into its forward half and backward half), and a
//! Chrome/Perfetto trace.
//!
//! Both images are rendered from one scene (rectangles and text), so they always agree. The
//! PNG is rasterised here with the committed DejaVu Sans font: no system fonts, no
//! fontconfig.

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use serde_json::{json, Value};

use crate::report::Report;
use crate::schedule::{Pass, PassKind};
use crate::ScheduleError;

static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

#[derive(Clone, Copy, Debug, PartialEq)]
struct Rgb(u8, u8, u8);

impl Rgb {
    fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

const BLACK: Rgb = Rgb(0, 0, 0);
const WHITE: Rgb = Rgb(255, 255, 255);
const GRID: Rgb = Rgb(200, 200, 200);

/// Fill colour of a pass: one hue per kind, a lighter tone for direction/leg 1.
fn color(p: &Pass) -> Rgb {
    let d = p.dir.min(1);
    match (p.kind, d) {
        (PassKind::F, 0) => Rgb(0xf6, 0xb2, 0x6b),
        (PassKind::F, _) => Rgb(0xfd, 0xe2, 0xc4),
        (PassKind::B, 0) => Rgb(0x93, 0xc4, 0x7d),
        (PassKind::B, _) => Rgb(0xd9, 0xea, 0xd3),
        (PassKind::I, 0) => Rgb(0x76, 0xa5, 0xaf),
        (PassKind::I, _) => Rgb(0xd0, 0xe0, 0xe3),
        (PassKind::W, 0) => Rgb(0x6f, 0xa8, 0xdc),
        (PassKind::W, _) => Rgb(0xcf, 0xe2, 0xf3),
    }
}

enum Shape {
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Rgb,
        stroke: Option<Rgb>,
    },
    /// Text with its left edge (centered = false) or centre at `x`, baseline at `y`.
    Text {
        x: f64,
        y: f64,
        size: f64,
        centered: bool,
        color: Rgb,
        text: String,
    },
}

struct Scene {
    width: f64,
    height: f64,
    shapes: Vec<Shape>,
}

const LEFT: f64 = 80.0;
const TOP: f64 = 40.0;
const ROW: f64 = 34.0;
const GAP: f64 = 6.0;

fn scene(r: &Report) -> Scene {
    let span = r.makespan.max(1e-9);
    // Aim for ~1400 px of timeline, but keep blocks legible and images bounded.
    let scale = (1400.0 / span).clamp(4.0, 80.0);
    let width = LEFT + span * scale + 20.0;
    let rows = r.devices as f64;
    let legend_y = TOP + rows * (ROW + GAP) + 14.0;
    let height = legend_y + 40.0;
    let mut s = Vec::new();
    s.push(Shape::Rect {
        x: 0.0,
        y: 0.0,
        w: width,
        h: height,
        fill: WHITE,
        stroke: None,
    });
    s.push(Shape::Text {
        x: 10.0,
        y: 22.0,
        size: 15.0,
        centered: false,
        color: BLACK,
        text: format!(
            "{}  PP={}  micro-batches={}  makespan={:.3}  bubble={:.3}  formula {}={:.3}",
            r.method.name(),
            r.pp,
            r.chunks,
            r.makespan,
            r.bubble_max,
            r.bubble_formula_text,
            r.bubble_formula
        ),
    });
    for (rank, ops) in r.ranks.iter().enumerate() {
        let y = TOP + rank as f64 * (ROW + GAP);
        s.push(Shape::Rect {
            x: LEFT,
            y,
            w: span * scale,
            h: ROW,
            fill: Rgb(0xf4, 0xf4, 0xf4),
            stroke: Some(GRID),
        });
        s.push(Shape::Text {
            x: 8.0,
            y: y + ROW * 0.65,
            size: 13.0,
            centered: false,
            color: BLACK,
            text: format!("Device {rank}"),
        });
        for op in ops {
            let x = LEFT + op.start * scale;
            let w = (op.end - op.start) * scale;
            let parts = op.passes.len() as f64;
            for (k, p) in op.passes.iter().enumerate() {
                // Overlapped passes share the block's time, split top/bottom.
                let h = ROW / parts;
                let py = y + k as f64 * h;
                s.push(Shape::Rect {
                    x,
                    y: py,
                    w,
                    h,
                    fill: color(p),
                    stroke: Some(BLACK),
                });
                let size = (h * 0.6).min(w * 0.7).min(13.0);
                if size >= 5.0 {
                    s.push(Shape::Text {
                        x: x + w / 2.0,
                        y: py + h / 2.0 + size * 0.36,
                        size,
                        centered: true,
                        color: BLACK,
                        text: p.mb.to_string(),
                    });
                }
            }
        }
    }
    // Legend.
    let mut lx = LEFT;
    let entries: [(&str, PassKind); 4] = [
        ("Forward", PassKind::F),
        ("Backward", PassKind::B),
        ("Backward for input", PassKind::I),
        ("Backward for weights", PassKind::W),
    ];
    for dir in 0..2 {
        for (name, kind) in entries {
            s.push(Shape::Rect {
                x: lx,
                y: legend_y + dir as f64 * 16.0 - 10.0,
                w: 12.0,
                h: 12.0,
                fill: color(&Pass::new(kind, 0, dir)),
                stroke: Some(BLACK),
            });
            let label = format!("{name} (dir {dir})");
            s.push(Shape::Text {
                x: lx + 16.0,
                y: legend_y + dir as f64 * 16.0,
                size: 11.0,
                centered: false,
                color: BLACK,
                text: label,
            });
            lx += 190.0;
        }
        lx = LEFT;
    }
    Scene {
        width: width.max(LEFT + 4.0 * 190.0),
        height,
        shapes: s,
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The timeline as a standalone SVG document.
pub fn svg(r: &Report) -> String {
    let sc = scene(r);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{:.0}\" viewBox=\"0 0 {:.0} {:.0}\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n",
        sc.width, sc.height, sc.width, sc.height
    );
    for sh in &sc.shapes {
        match sh {
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill,
                stroke,
            } => {
                let st = stroke
                    .map(|c| format!(" stroke=\"{}\" stroke-width=\"0.6\"", c.hex()))
                    .unwrap_or_default();
                out += &format!(
                    "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"{}\"{st}/>\n",
                    fill.hex()
                );
            }
            Shape::Text {
                x,
                y,
                size,
                centered,
                color,
                text,
            } => {
                let anchor = if *centered {
                    " text-anchor=\"middle\""
                } else {
                    ""
                };
                out += &format!(
                    "<text x=\"{x:.2}\" y=\"{y:.2}\" font-size=\"{size:.1}\" fill=\"{}\"{anchor}>{}</text>\n",
                    color.hex(),
                    esc(text)
                );
            }
        }
    }
    out += "</svg>\n";
    out
}

/// An RGB raster with just what the timeline needs.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<Rgb>,
}

impl Canvas {
    fn blend(&mut self, x: i64, y: i64, c: Rgb, a: f32) {
        if x < 0 || y < 0 || x as usize >= self.w || y as usize >= self.h {
            return;
        }
        let i = y as usize * self.w + x as usize;
        let o = self.px[i];
        let mix = |s: u8, d: u8| (s as f32 * a + d as f32 * (1.0 - a)).round() as u8;
        self.px[i] = Rgb(mix(c.0, o.0), mix(c.1, o.1), mix(c.2, o.2));
    }
    fn fill(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, c: Rgb) {
        let (xa, xb) = (x0.round() as i64, x1.round() as i64);
        let (ya, yb) = (y0.round() as i64, y1.round() as i64);
        for y in ya..yb {
            for x in xa..xb {
                self.blend(x, y, c, 1.0);
            }
        }
    }
}

/// The timeline as PNG bytes.
pub fn png(r: &Report) -> Result<Vec<u8>, ScheduleError> {
    let sc = scene(r);
    let font = FontRef::try_from_slice(FONT)
        .map_err(|e| ScheduleError::Invalid(format!("embedded font unreadable: {e}")))?;
    let (w, h) = (sc.width.ceil() as usize, sc.height.ceil() as usize);
    let limit = crate::limits::MAX_PICTURE_PIXELS;
    if !matches!(w.checked_mul(h), Some(px) if px <= limit) {
        return Err(ScheduleError::Invalid(format!(
            "a PNG of {w}x{h} pixels is above the limit of {limit} pixels (draw it as SVG)"
        )));
    }
    let mut cv = Canvas {
        w,
        h,
        px: vec![WHITE; w * h],
    };
    for sh in &sc.shapes {
        match sh {
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill,
                stroke,
            } => {
                cv.fill(*x, *y, x + w, y + h, *fill);
                if let Some(c) = stroke {
                    cv.fill(*x, *y, x + w, y + 1.0, *c);
                    cv.fill(*x, y + h - 1.0, x + w, y + h, *c);
                    cv.fill(*x, *y, x + 1.0, y + h, *c);
                    cv.fill(x + w - 1.0, *y, x + w, y + h, *c);
                }
            }
            Shape::Text {
                x,
                y,
                size,
                centered,
                color,
                text,
            } => {
                let scale = PxScale::from(*size as f32);
                let sf = font.as_scaled(scale);
                let width: f32 = text.chars().map(|ch| sf.h_advance(font.glyph_id(ch))).sum();
                let mut pen = if *centered {
                    *x as f32 - width / 2.0
                } else {
                    *x as f32
                };
                for ch in text.chars() {
                    let id = font.glyph_id(ch);
                    let g = id.with_scale_and_position(scale, ab_glyph::point(pen, *y as f32));
                    if let Some(og) = font.outline_glyph(g) {
                        let b = og.px_bounds();
                        og.draw(|gx, gy, cov| {
                            cv.blend(
                                b.min.x as i64 + gx as i64,
                                b.min.y as i64 + gy as i64,
                                *color,
                                cov.min(1.0),
                            );
                        });
                    }
                    pen += sf.h_advance(id);
                }
            }
        }
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w as u32, h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc
            .write_header()
            .map_err(|e| ScheduleError::Invalid(format!("png: {e}")))?;
        let data: Vec<u8> = cv.px.iter().flat_map(|p| [p.0, p.1, p.2]).collect();
        wr.write_image_data(&data)
            .map_err(|e| ScheduleError::Invalid(format!("png: {e}")))?;
    }
    Ok(out)
}

/// A Chrome/Perfetto trace (`chrome://tracing`, ui.perfetto.dev): one thread per device,
/// one complete event per op. One cost unit is shown as one millisecond.
pub fn chrome_trace(r: &Report) -> Value {
    let mut ev = Vec::new();
    for rank in 0..r.devices {
        ev.push(
            json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"name": format!("device {rank}")}}),
        );
    }
    for (rank, ops) in r.ranks.iter().enumerate() {
        for op in ops {
            let name = op
                .passes
                .iter()
                .map(|p| {
                    format!(
                        "{}{}{}",
                        p.kind.letter(),
                        p.mb,
                        if p.dir == 1 { "'" } else { "" }
                    )
                })
                .collect::<Vec<_>>()
                .join("&");
            let cat = op
                .passes
                .iter()
                .map(|p| p.kind.letter())
                .collect::<Vec<_>>()
                .join("&");
            ev.push(json!({
                "name": name, "cat": cat, "ph": "X", "pid": 0, "tid": rank,
                "ts": op.start * 1000.0, "dur": (op.end - op.start) * 1000.0,
                "args": {"passes": op.passes},
            }));
        }
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ms",
           "otherData": {"method": r.method.name(), "pp": r.pp, "chunks": r.chunks}})
}
