//! Plots of an SM-budget sweep: step time and exposed communication against the budget, with
//! the knee marked. SVG is written by hand; PNG is rasterised here (lines, markers) with text
//! from the committed DejaVu Sans font through `ab_glyph`, so no system fonts are needed.

use crate::error::{Result, SimError};
use crate::Sweep;
use ab_glyph::{Font, FontRef, PxScale, ScaleFont};

pub(crate) const W: f64 = 800.0;
pub(crate) const H: f64 = 500.0;
pub(crate) const ML: f64 = 70.0;
pub(crate) const MR: f64 = 70.0;
pub(crate) const MT: f64 = 50.0;
pub(crate) const MB: f64 = 60.0;

struct Series {
    xs: Vec<f64>,
    step: Vec<Option<f64>>,
    exposed: Vec<Option<f64>>,
    x0: f64,
    x1: f64,
    y_step: f64,
    y_exp: f64,
}

fn series(s: &Sweep) -> Result<Series> {
    if s.points.is_empty() {
        return Err(SimError::Sweep {
            spec: "plot".into(),
            rule: "no points to plot".into(),
        });
    }
    let xs: Vec<f64> = s.points.iter().map(|p| p.comm_sms as f64).collect();
    let step: Vec<Option<f64>> = s.points.iter().map(|p| p.step_time_s).collect();
    let exposed: Vec<Option<f64>> = s.points.iter().map(|p| p.exposed_comm_s).collect();
    let maxof = |v: &Vec<Option<f64>>| v.iter().flatten().cloned().fold(0.0, f64::max);
    let x0 = xs[0];
    let x1 = xs[xs.len() - 1].max(x0 + 1.0);
    Ok(Series {
        xs,
        y_step: nice(maxof(&step)),
        y_exp: nice(maxof(&exposed)),
        step,
        exposed,
        x0,
        x1,
    })
}

pub(crate) fn nice(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * e >= v * 1.05 {
            return m * e;
        }
    }
    10.0 * e
}

impl Series {
    fn px(&self, x: f64) -> f64 {
        ML + (x - self.x0) / (self.x1 - self.x0) * (W - ML - MR)
    }
    fn py(&self, y: f64, max: f64) -> f64 {
        H - MB - y / max * (H - MT - MB)
    }
}

/// SVG text of the sweep plot.
pub fn svg(s: &Sweep, title: &str) -> Result<String> {
    let se = series(s)?;
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    o += &format!(
        "<text x=\"{}\" y=\"25\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    // Axes and ticks.
    o += &format!(
        "<path d=\"M{ML} {MT} V{} H{}\" stroke=\"black\" fill=\"none\"/>\n<line x1=\"{}\" y1=\"{MT}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        H - MB,
        W - MR,
        W - MR,
        W - MR,
        H - MB
    );
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let y = H - MB - f * (H - MT - MB);
        o += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#1f5fbf\">{:.2}</text>\n<text x=\"{}\" y=\"{}\" fill=\"#c0392b\">{:.2}</text>\n<line x1=\"{ML}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/>\n",
            ML - 6.0, y + 4.0, f * se.y_step, W - MR + 6.0, y + 4.0, f * se.y_exp, W - MR
        );
    }
    let step_x = ((se.x1 - se.x0) / 10.0).ceil().max(1.0);
    let mut x = se.x0;
    while x <= se.x1 + 1e-9 {
        o += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            se.px(x),
            H - MB + 18.0,
            x
        );
        x += step_x;
    }
    o += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">communication SMs</text>\n",
        W / 2.0,
        H - 15.0
    );
    o += &format!("<text x=\"15\" y=\"{}\" fill=\"#1f5fbf\" transform=\"rotate(-90 15 {})\" text-anchor=\"middle\">step time (s)</text>\n", H / 2.0, H / 2.0);
    o += &format!("<text x=\"{}\" y=\"{}\" fill=\"#c0392b\" transform=\"rotate(90 {} {})\" text-anchor=\"middle\">exposed communication (s)</text>\n", W - 15.0, H / 2.0, W - 15.0, H / 2.0);
    for (vals, max, color) in [
        (&se.step, se.y_step, "#1f5fbf"),
        (&se.exposed, se.y_exp, "#c0392b"),
    ] {
        let mut d = String::new();
        let mut pen = false;
        for (i, v) in vals.iter().enumerate() {
            match v {
                Some(y) => {
                    d += &format!(
                        "{}{:.1} {:.1} ",
                        if pen { "L" } else { "M" },
                        se.px(se.xs[i]),
                        se.py(*y, max)
                    );
                    pen = true;
                }
                None => pen = false,
            }
        }
        o += &format!("<path d=\"{d}\" stroke=\"{color}\" stroke-width=\"2\" fill=\"none\"/>\n");
        for (i, v) in vals.iter().enumerate() {
            if let Some(y) = v {
                o += &format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"/>\n",
                    se.px(se.xs[i]),
                    se.py(*y, max)
                );
            }
        }
    }
    if let Some(k) = s.knee_sms {
        let x = se.px(k as f64);
        o += &format!(
            "<line x1=\"{x}\" y1=\"{MT}\" x2=\"{x}\" y2=\"{}\" stroke=\"#2e8b57\" stroke-dasharray=\"5,4\"/>\n<text x=\"{}\" y=\"{}\" fill=\"#2e8b57\">knee: {k} SMs</text>\n",
            H - MB,
            x + 5.0,
            MT + 15.0
        );
    }
    for (i, p) in s.points.iter().enumerate() {
        if p.step_time_s.is_none() {
            o += &format!(
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#888\">x</text>\n",
                se.px(se.xs[i]),
                H - MB - 5.0
            );
        }
    }
    o += "</svg>\n";
    Ok(o)
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An RGB canvas.
pub(crate) struct Canvas {
    w: usize,
    h: usize,
    px: Vec<[f32; 3]>,
}

impl Canvas {
    /// PNG bytes of the canvas.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let c = self;
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, c.w as u32, c.h as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let io = |e: png::EncodingError| SimError::Io {
                path: "png".into(),
                message: e.to_string(),
            };
            let mut wr = enc.write_header().map_err(io)?;
            let data: Vec<u8> =
                c.px.iter()
                    .flat_map(|p| p.map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8))
                    .collect();
            wr.write_image_data(&data).map_err(io)?;
        }
        Ok(out)
    }
    pub(crate) fn new(w: usize, h: usize) -> Self {
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
    pub(crate) fn dot(&mut self, x: f64, y: f64, r: f64, c: [f32; 3]) {
        let (x0, x1) = ((x - r - 1.0) as i64, (x + r + 1.0) as i64);
        let (y0, y1) = ((y - r - 1.0) as i64, (y + r + 1.0) as i64);
        for yy in y0..=y1 {
            for xx in x0..=x1 {
                let d = ((xx as f64 + 0.5 - x).powi(2) + (yy as f64 + 0.5 - y).powi(2)).sqrt();
                let a = (r + 0.5 - d).clamp(0.0, 1.0) as f32;
                if a > 0.0 {
                    self.blend(xx, yy, c, a);
                }
            }
        }
    }
    pub(crate) fn line(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        width: f64,
        c: [f32; 3],
        dash: bool,
    ) {
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        let n = (len * 2.0).ceil().max(1.0) as usize;
        for i in 0..=n {
            let t = i as f64 / n as f64;
            if dash && ((t * len / 5.0) as usize) % 2 == 1 {
                continue;
            }
            self.dot(a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), width / 2.0, c);
        }
    }
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn text(
        &mut self,
        font: &FontRef,
        s: &str,
        x: f64,
        y: f64,
        size: f32,
        c: [f32; 3],
        anchor: f64,
    ) {
        let scale = PxScale::from(size);
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
}

pub(crate) const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// PNG bytes of the sweep plot.
pub fn png(s: &Sweep, title: &str) -> Result<Vec<u8>> {
    let se = series(s)?;
    let font = FontRef::try_from_slice(FONT).map_err(|e| SimError::Io {
        path: "DejaVuSans.ttf".into(),
        message: e.to_string(),
    })?;
    let mut c = Canvas::new(W as usize, H as usize);
    let black = [0.0, 0.0, 0.0];
    let grey = [0.85, 0.85, 0.85];
    let blue = [0.12, 0.37, 0.75];
    let red = [0.75, 0.22, 0.17];
    let green = [0.18, 0.55, 0.34];
    c.text(&font, title, W / 2.0, 28.0, 16.0, black, 0.5);
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let y = H - MB - f * (H - MT - MB);
        c.line((ML, y), (W - MR, y), 1.0, grey, false);
        c.text(
            &font,
            &format!("{:.2}", f * se.y_step),
            ML - 6.0,
            y + 4.0,
            12.0,
            blue,
            1.0,
        );
        c.text(
            &font,
            &format!("{:.2}", f * se.y_exp),
            W - MR + 6.0,
            y + 4.0,
            12.0,
            red,
            0.0,
        );
    }
    c.line((ML, MT), (ML, H - MB), 1.0, black, false);
    c.line((ML, H - MB), (W - MR, H - MB), 1.0, black, false);
    c.line((W - MR, MT), (W - MR, H - MB), 1.0, black, false);
    let step_x = ((se.x1 - se.x0) / 10.0).ceil().max(1.0);
    let mut x = se.x0;
    while x <= se.x1 + 1e-9 {
        c.text(
            &font,
            &format!("{x}"),
            se.px(x),
            H - MB + 18.0,
            12.0,
            black,
            0.5,
        );
        x += step_x;
    }
    c.text(
        &font,
        "communication SMs",
        W / 2.0,
        H - 15.0,
        13.0,
        black,
        0.5,
    );
    c.text(&font, "step time (s)", ML, MT - 10.0, 12.0, blue, 0.5);
    c.text(&font, "exposed comm (s)", W - MR, MT - 10.0, 12.0, red, 0.5);
    for (vals, max, color) in [(&se.step, se.y_step, blue), (&se.exposed, se.y_exp, red)] {
        let mut prev: Option<(f64, f64)> = None;
        for (i, v) in vals.iter().enumerate() {
            match v {
                Some(y) => {
                    let p = (se.px(se.xs[i]), se.py(*y, max));
                    if let Some(q) = prev {
                        c.line(q, p, 2.0, color, false);
                    }
                    c.dot(p.0, p.1, 2.5, color);
                    prev = Some(p);
                }
                None => prev = None,
            }
        }
    }
    if let Some(k) = s.knee_sms {
        let x = se.px(k as f64);
        c.line((x, MT), (x, H - MB), 1.0, green, true);
        c.text(
            &font,
            &format!("knee: {k} SMs"),
            x + 5.0,
            MT + 15.0,
            12.0,
            green,
            0.0,
        );
    }
    c.encode()
}
