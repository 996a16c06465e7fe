//! The loss curve: training loss per step, validation loss at its steps, and an optional
//! horizontal reference (the corpus's unigram entropy), as a hand-written SVG and as a PNG
//! drawn on an RGB canvas (antialiased lines, text rendered with `ab_glyph` from the DejaVu
//! Sans font in `assets/fonts`), both with axes, ticks, labels and a legend, both written
//! atomically. The workspace has no `plotters`; `png` and `ab_glyph` are already dependencies
//! of `sim`.

use crate::atomic::IoError;
use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use std::fmt::Write as _;
use std::path::Path;

const W: f64 = 800.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Errors of drawing or writing a plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("loss curve: {0}")]
    Data(String),
    #[error("loss curve PNG: {0}")]
    Png(String),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The curves to draw (losses in nats per token).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossCurve {
    pub title: String,
    /// (step, training loss)
    pub train: Vec<(u32, f64)>,
    /// (step, validation loss)
    pub valid: Vec<(u32, f64)>,
    /// (label, value): a horizontal reference line, e.g. the unigram entropy.
    pub reference: Option<(String, f64)>,
}

/// The data-to-pixel mapping.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn px(&self, step: f64, loss: f64) -> (f64, f64) {
        let x = LEFT + (step - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT);
        let y = TOP + (self.y1 - loss) / (self.y1 - self.y0) * (H - TOP - BOTTOM);
        (x, y)
    }
}

impl LossCurve {
    fn frame(&self) -> Result<Frame, PlotError> {
        let pts = self.train.iter().chain(&self.valid);
        if let Some((s, v)) = pts.clone().find(|(_, v)| !v.is_finite()) {
            return Err(PlotError::Data(format!(
                "loss {v} at step {s} is not finite"
            )));
        }
        let refv = self
            .reference
            .as_ref()
            .map(|r| r.1)
            .filter(|v| v.is_finite());
        let ys: Vec<f64> = pts.clone().map(|p| p.1).chain(refv).collect();
        let xs: Vec<f64> = pts.map(|p| p.0 as f64).collect();
        if xs.is_empty() {
            return Err(PlotError::Data("no points".into()));
        }
        let (lo, hi) = min_max(&ys);
        let pad = ((hi - lo) * 0.05).max(1e-3);
        let (x0, x1) = min_max(&xs);
        Ok(Frame {
            x0,
            x1: if x1 > x0 { x1 } else { x0 + 1.0 },
            y0: (lo - pad).max(0.0),
            y1: hi + pad,
        })
    }

    /// SVG text of the plot.
    pub fn svg(&self) -> Result<String, PlotError> {
        let f = self.frame()?;
        let mut o = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
            W / 2.0,
            esc(&self.title)
        );
        axes_svg(&mut o, &f);
        if let Some((label, v)) = &self.reference {
            let (a, b) = (f.px(f.x0, *v), f.px(f.x1, *v));
            let _ = writeln!(o, "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#777\" stroke-dasharray=\"6 4\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{} ({v:.3})</text>",
                a.0, a.1, b.0, b.1, b.0 - 4.0, b.1 - 5.0, esc(label));
        }
        for (pts, color, name, dy) in [
            (&self.train, "#1f5fbf", "train", 0.0),
            (&self.valid, "#c0392b", "validation", 18.0),
        ] {
            let path: Vec<String> = pts
                .iter()
                .map(|&(s, v)| {
                    let p = f.px(s as f64, v);
                    format!("{:.1},{:.1}", p.0, p.1)
                })
                .collect();
            let _ = writeln!(
                o,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                path.join(" ")
            );
            let (lx, ly) = (W - RIGHT - 150.0, TOP + 15.0 + dy);
            let _ = writeln!(o, "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>\n<text x=\"{}\" y=\"{}\">{name}</text>", lx + 24.0, lx + 30.0, ly + 4.0);
        }
        o += "</svg>\n";
        Ok(o)
    }

    /// PNG bytes of the plot (the SVG's content, same geometry).
    pub fn png(&self) -> Result<Vec<u8>, PlotError> {
        let f = self.frame()?;
        let font = FontRef::try_from_slice(FONT).map_err(|e| PlotError::Png(e.to_string()))?;
        let mut c = Canvas::new(W as usize, H as usize);
        let (grey, black, dim) = ([0.85; 3], [0.0; 3], [0.33; 3]);
        let ((bx, by), (ex, ey)) = (f.px(f.x0, f.y0), f.px(f.x1, f.y1));
        for x in ticks(f.x0, f.x1) {
            let (px, _) = f.px(x, f.y0);
            c.line((px, ey), (px, by), 1.0, grey);
            c.text(
                &font,
                &fmt_tick(x),
                (px, by + 16.0),
                style(12.0, black, 0.5),
            );
        }
        for y in ticks(f.y0, f.y1) {
            let (_, py) = f.px(f.x0, y);
            c.line((bx, py), (ex, py), 1.0, grey);
            c.text(
                &font,
                &fmt_tick(y),
                (bx - 6.0, py + 4.0),
                style(12.0, black, 1.0),
            );
        }
        c.line((bx, by), (ex, by), 1.5, black);
        c.line((bx, by), (bx, ey), 1.5, black);
        c.text(&font, &self.title, (W / 2.0, 24.0), style(15.0, black, 0.5));
        c.text(
            &font,
            "step",
            ((bx + ex) / 2.0, H - 12.0),
            style(12.0, black, 0.5),
        );
        c.text(
            &font,
            "loss (nats/token)",
            (8.0, TOP - 10.0),
            style(12.0, black, 0.0),
        );
        if let Some((label, v)) = &self.reference {
            let (a, b) = (f.px(f.x0, *v), f.px(f.x1, *v));
            c.line(a, b, 1.5, [0.47; 3]);
            c.text(
                &font,
                &format!("{label} ({v:.3})"),
                (b.0 - 4.0, b.1 - 5.0),
                style(12.0, dim, 1.0),
            );
        }
        let series = [
            (&self.train, TRAIN_RGB, "train", 0.0),
            (&self.valid, VALID_RGB, "validation", 18.0),
        ];
        for (pts, color, name, dy) in series {
            for w in pts.windows(2) {
                c.line(
                    f.px(w[0].0 as f64, w[0].1),
                    f.px(w[1].0 as f64, w[1].1),
                    2.0,
                    color,
                );
            }
            if let [p] = pts.as_slice() {
                let (x, y) = f.px(p.0 as f64, p.1);
                c.dot(x, y, 2.5, color);
            }
            let (lx, ly) = (W - RIGHT - 150.0, TOP + 15.0 + dy);
            c.line((lx, ly), (lx + 24.0, ly), 2.0, color);
            c.text(&font, name, (lx + 30.0, ly + 4.0), style(12.0, black, 0.0));
        }
        c.encode()
    }

    /// Writes the SVG to `path` atomically.
    pub fn write_svg(&self, path: &Path) -> Result<(), PlotError> {
        Ok(crate::atomic::write(path, self.svg()?.as_bytes())?)
    }

    /// Writes the PNG to `path` atomically.
    pub fn write_png(&self, path: &Path) -> Result<(), PlotError> {
        Ok(crate::atomic::write(path, &self.png()?)?)
    }
}

fn axes_svg(o: &mut String, f: &Frame) {
    let (bx, by) = f.px(f.x0, f.y0);
    let (ex, ey) = f.px(f.x1, f.y1);
    for x in ticks(f.x0, f.x1) {
        let (px, _) = f.px(x, f.y0);
        let _ = writeln!(o, "<line x1=\"{px:.1}\" y1=\"{ey:.1}\" x2=\"{px:.1}\" y2=\"{by:.1}\" stroke=\"#ddd\"/>\n<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>", by + 16.0, fmt_tick(x));
    }
    for y in ticks(f.y0, f.y1) {
        let (_, py) = f.px(f.x0, y);
        let _ = writeln!(o, "<line x1=\"{bx:.1}\" y1=\"{py:.1}\" x2=\"{ex:.1}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", bx - 6.0, py + 4.0, fmt_tick(y));
    }
    let _ = writeln!(o, "<line x1=\"{bx:.1}\" y1=\"{by:.1}\" x2=\"{ex:.1}\" y2=\"{by:.1}\" stroke=\"black\"/>\n<line x1=\"{bx:.1}\" y1=\"{by:.1}\" x2=\"{bx:.1}\" y2=\"{ey:.1}\" stroke=\"black\"/>");
    let _ = writeln!(o, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">step</text>\n<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">loss (nats/token)</text>", (bx + ex) / 2.0, H - 12.0, (by + ey) / 2.0);
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

/// About 5-10 round tick values in `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-9);
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 8.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
/// Curve colours of the PNG (the SVG's `#1f5fbf` and `#c0392b`).
const TRAIN_RGB: [f32; 3] = [0.12, 0.37, 0.75];
const VALID_RGB: [f32; 3] = [0.75, 0.22, 0.17];

/// How a text is drawn: size in pixels, colour, horizontal anchor (0 left, 0.5 centre, 1 right).
#[derive(Clone, Copy)]
struct Style {
    size: f32,
    color: [f32; 3],
    anchor: f64,
}

const fn style(size: f32, color: [f32; 3], anchor: f64) -> Style {
    Style {
        size,
        color,
        anchor,
    }
}

/// An RGB canvas with antialiased round-capped lines and text.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<[f32; 3]>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![[1.0; 3]; w * h],
        }
    }
    fn blend(&mut self, x: i64, y: i64, c: [f32; 3], a: f32) {
        if x < 0 || y < 0 || x as usize >= self.w || y as usize >= self.h {
            return;
        }
        let p = &mut self.px[y as usize * self.w + x as usize];
        for i in 0..3 {
            p[i] = p[i] * (1.0 - a) + c[i] * a;
        }
    }
    fn dot(&mut self, x: f64, y: f64, r: f64, c: [f32; 3]) {
        for yy in (y - r - 1.0) as i64..=(y + r + 1.0) as i64 {
            for xx in (x - r - 1.0) as i64..=(x + r + 1.0) as i64 {
                let d = ((xx as f64 + 0.5 - x).powi(2) + (yy as f64 + 0.5 - y).powi(2)).sqrt();
                let a = (r + 0.5 - d).clamp(0.0, 1.0) as f32;
                if a > 0.0 {
                    self.blend(xx, yy, c, a);
                }
            }
        }
    }
    fn line(&mut self, a: (f64, f64), b: (f64, f64), width: f64, c: [f32; 3]) {
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        let n = (len * 2.0).ceil().max(1.0) as usize;
        for i in 0..=n {
            let t = i as f64 / n as f64;
            self.dot(a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), width / 2.0, c);
        }
    }
    /// `s` with its baseline at `y`, horizontally anchored at `x` (0 left, 0.5 centre, 1 right).
    fn text(&mut self, font: &FontRef, s: &str, (x, y): (f64, f64), st: Style) {
        let (c, anchor) = (st.color, st.anchor);
        let scale = PxScale::from(st.size);
        let sf = font.as_scaled(scale);
        let width: f32 = s.chars().map(|ch| sf.h_advance(font.glyph_id(ch))).sum();
        let mut pen = x as f32 - width * anchor as f32;
        for ch in s.chars() {
            let id = font.glyph_id(ch);
            let g = id.with_scale_and_position(scale, ab_glyph::point(pen, y as f32));
            if let Some(o) = font.outline_glyph(g) {
                let bb = o.px_bounds();
                o.draw(|gx, gy, cov| {
                    self.blend(
                        bb.min.x as i64 + gx as i64,
                        bb.min.y as i64 + gy as i64,
                        c,
                        cov,
                    )
                });
            }
            pen += sf.h_advance(id);
        }
    }
    fn encode(&self) -> Result<Vec<u8>, PlotError> {
        let mut out = Vec::new();
        let err = |e: png::EncodingError| PlotError::Png(e.to_string());
        {
            let mut enc = png::Encoder::new(&mut out, self.w as u32, self.h as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut wr = enc.write_header().map_err(err)?;
            let data: Vec<u8> = self
                .px
                .iter()
                .flat_map(|p| p.map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8))
                .collect();
            wr.write_image_data(&data).map_err(err)?;
        }
        Ok(out)
    }
}
