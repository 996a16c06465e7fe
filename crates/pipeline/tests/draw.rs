//! SVG, PNG and trace outputs carry one block per pass and decode as what they claim to be.

use pipeline::*;

fn report(m: Method, pp: usize, ch: usize) -> Report {
    Report::new(
        &generate(m, pp, ch).unwrap(),
        &Costs {
            f: 1.0,
            b: 2.0,
            w: 1.0,
            fb: 3.0,
            p2p: 0.0,
        },
    )
    .unwrap()
}

#[test]
fn svg_has_one_block_per_pass() {
    let r = report(Method::DualPipe, 8, 20);
    let svg = draw::svg(&r);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let passes: usize = r.ranks.iter().flatten().map(|o| o.passes.len()).sum();
    // Blocks + background + one lane per device + 8 legend swatches.
    let rects = svg.matches("<rect").count();
    assert_eq!(rects, passes + 1 + r.devices + 8);
    assert!(svg.contains("Device 7"));
}

#[test]
fn png_decodes_and_is_drawn() {
    let r = report(Method::OneFOneB, 4, 8);
    let bytes = draw::png(&r).unwrap();
    let dec = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(info.width > 400 && info.height > 100);
    let px = &buf[..info.buffer_size()];
    // Some pixels carry the forward colour, some are dark (text and borders).
    let forward = px.chunks(3).filter(|p| p == &[0xf6, 0xb2, 0x6b]).count();
    let dark = px
        .chunks(3)
        .filter(|p| p[0] < 60 && p[1] < 60 && p[2] < 60)
        .count();
    assert!(forward > 100, "{forward}");
    assert!(dark > 100, "{dark}");
}

#[test]
fn chrome_trace_has_an_event_per_op() {
    let r = report(Method::DualPipeV, 8, 16);
    let t = draw::chrome_trace(&r);
    let ev = t["traceEvents"].as_array().unwrap();
    let ops: usize = r.ranks.iter().map(|o| o.len()).sum();
    assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count(), ops);
    assert_eq!(ev.iter().filter(|e| e["ph"] == "M").count(), r.devices);
    assert!(ev.iter().any(|e| e["name"].as_str().unwrap().contains('&')));
}
