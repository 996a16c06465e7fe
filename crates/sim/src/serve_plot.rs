//! Picture of a serving sweep: decode output tokens/s per node against tokens/s per user, one
//! point per batch size, with the speed target, the chosen batch and DeepSeek's published
//! operating point marked. SVG by hand, PNG through the canvas of [`crate::plot`].

use crate::error::{Result, SimError};
use crate::plot::{esc, nice, Canvas, FONT, H, MB, ML, MR, MT, W};
use crate::serve::ServeSweep;
use ab_glyph::FontRef;

struct Axes {
    x_max: f64,
    y_max: f64,
}

impl Axes {
    fn new(s: &ServeSweep) -> Result<Axes> {
        if s.points.is_empty() {
            return Err(SimError::Sweep {
                spec: "plot".into(),
                rule: "no points to plot".into(),
            });
        }
        let xm = s
            .points
            .iter()
            .map(|p| p.tokens_per_s_per_user)
            .fold(s.published.0, f64::max);
        let ym = s
            .points
            .iter()
            .map(|p| p.output_tokens_per_s_per_node)
            .fold(s.published.1, f64::max);
        Ok(Axes {
            x_max: nice(xm.max(s.target_tokens_per_s_per_user)),
            y_max: nice(ym),
        })
    }
    fn px(&self, x: f64) -> f64 {
        ML + x / self.x_max * (W - ML - MR)
    }
    fn py(&self, y: f64) -> f64 {
        H - MB - y / self.y_max * (H - MT - MB)
    }
}

/// SVG text of the serving sweep.
pub fn svg(s: &ServeSweep, title: &str) -> Result<String> {
    let a = Axes::new(s)?;
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"25\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    o += &format!(
        "<path d=\"M{ML} {MT} V{} H{}\" stroke=\"black\" fill=\"none\"/>\n",
        H - MB,
        W - MR
    );
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (x, y) = (a.px(f * a.x_max), a.py(f * a.y_max));
        o += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text>\n<line x1=\"{ML}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/>\n<text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{:.0}</text>\n",
            ML - 6.0, y + 4.0, f * a.y_max, W - MR, H - MB + 18.0, f * a.x_max
        );
    }
    o += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">output tokens/s per user</text>\n",
        W / 2.0,
        H - 15.0
    );
    o += &format!("<text x=\"15\" y=\"{}\" transform=\"rotate(-90 15 {})\" text-anchor=\"middle\">output tokens/s per node</text>\n", H / 2.0, H / 2.0);
    let tx = a.px(s.target_tokens_per_s_per_user);
    o += &format!("<line x1=\"{tx}\" y1=\"{MT}\" x2=\"{tx}\" y2=\"{}\" stroke=\"#2e8b57\" stroke-dasharray=\"5,4\"/>\n<text x=\"{}\" y=\"{}\" fill=\"#2e8b57\">target {} tok/s/user</text>\n", H - MB, tx + 5.0, MT + 15.0, s.target_tokens_per_s_per_user);
    let mut d = String::new();
    for (i, p) in s.points.iter().enumerate() {
        let (x, y) = (
            a.px(p.tokens_per_s_per_user),
            a.py(p.output_tokens_per_s_per_node),
        );
        d += &format!("{}{x:.1} {y:.1} ", if i == 0 { "M" } else { "L" });
        let color = if p.fits_memory { "#1f5fbf" } else { "#aaa" };
        o += &format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.5\" fill=\"{color}\"/>\n");
        if Some(p.batch_per_gpu) == s.chosen_batch {
            o += &format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"6\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>\n<text x=\"{}\" y=\"{}\" fill=\"#1f5fbf\">batch {} per GPU</text>\n", x + 8.0, y - 8.0, p.batch_per_gpu);
        }
    }
    o += &format!("<path d=\"{d}\" stroke=\"#1f5fbf\" stroke-width=\"1.5\" fill=\"none\"/>\n");
    let (px, py) = (a.px(s.published.0), a.py(s.published.1));
    o += &format!("<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"#c0392b\"/>\n<text x=\"{}\" y=\"{}\" fill=\"#c0392b\">DeepSeek published</text>\n</svg>\n", px - 5.0, py - 5.0, px + 8.0, py + 16.0);
    Ok(o)
}

/// PNG bytes of the serving sweep.
pub fn png(s: &ServeSweep, title: &str) -> Result<Vec<u8>> {
    let a = Axes::new(s)?;
    let font = FontRef::try_from_slice(FONT).map_err(|e| SimError::Io {
        path: "DejaVuSans.ttf".into(),
        message: e.to_string(),
    })?;
    let mut c = Canvas::new(W as usize, H as usize);
    let (black, grey) = ([0.0, 0.0, 0.0], [0.85, 0.85, 0.85]);
    let (blue, red, green) = ([0.12, 0.37, 0.75], [0.75, 0.22, 0.17], [0.18, 0.55, 0.34]);
    c.text(&font, title, W / 2.0, 28.0, 16.0, black, 0.5);
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (x, y) = (a.px(f * a.x_max), a.py(f * a.y_max));
        c.line((ML, y), (W - MR, y), 1.0, grey, false);
        c.text(
            &font,
            &format!("{:.0}", f * a.y_max),
            ML - 6.0,
            y + 4.0,
            12.0,
            black,
            1.0,
        );
        c.text(
            &font,
            &format!("{:.0}", f * a.x_max),
            x,
            H - MB + 18.0,
            12.0,
            black,
            0.5,
        );
    }
    c.line((ML, MT), (ML, H - MB), 1.0, black, false);
    c.line((ML, H - MB), (W - MR, H - MB), 1.0, black, false);
    c.text(
        &font,
        "output tokens/s per user",
        W / 2.0,
        H - 15.0,
        13.0,
        black,
        0.5,
    );
    c.text(
        &font,
        "output tokens/s per node",
        ML,
        MT - 10.0,
        12.0,
        black,
        0.5,
    );
    let tx = a.px(s.target_tokens_per_s_per_user);
    c.line((tx, MT), (tx, H - MB), 1.0, green, true);
    c.text(
        &font,
        &format!("target {} tok/s/user", s.target_tokens_per_s_per_user),
        tx + 5.0,
        MT + 15.0,
        12.0,
        green,
        0.0,
    );
    let mut prev: Option<(f64, f64)> = None;
    for p in &s.points {
        let q = (
            a.px(p.tokens_per_s_per_user),
            a.py(p.output_tokens_per_s_per_node),
        );
        if let Some(r) = prev {
            c.line(r, q, 1.5, blue, false);
        }
        c.dot(q.0, q.1, 2.5, if p.fits_memory { blue } else { grey });
        if Some(p.batch_per_gpu) == s.chosen_batch {
            c.dot(q.0, q.1, 5.0, blue);
            c.text(
                &font,
                &format!("batch {} per GPU", p.batch_per_gpu),
                q.0 + 8.0,
                q.1 - 8.0,
                12.0,
                blue,
                0.0,
            );
        }
        prev = Some(q);
    }
    let (px, py) = (a.px(s.published.0), a.py(s.published.1));
    c.dot(px, py, 5.0, red);
    c.text(
        &font,
        "DeepSeek published",
        px + 8.0,
        py + 16.0,
        12.0,
        red,
        0.0,
    );
    c.encode()
}
