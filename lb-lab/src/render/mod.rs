//! The render test: every chart the project produces, rasterised as a person's viewer would, checked for
//! text off the canvas. The charts: the demo's timeline (from a recorded run, `fixtures/demo-timeline.json`,
//! so no in-kernel work), the study's chart of every scenario in examples/study/ (through the study code),
//! and the benchmark report's charts (from its test fixture). Each is rendered to PNG with rsvg-convert
//! (librsvg; `cargo xtask setup` installs Debian's librsvg2-bin); the PNGs are left in `target/charts/` to be
//! looked at.
//!
//! How text off the canvas is found (measured, not estimated): each chart's `<text>` elements alone are put
//! in a document whose view box reaches [`MARGIN`] pixels past every edge of the chart's canvas, and
//! rsvg-convert renders that with a transparent background. Any ink in that border (more than a pixel past
//! the edge, which anti-aliasing may reach) is glyphs outside the canvas, laid out with the real font
//! fontconfig picks for `sans-serif` on this machine. Each text's anchor is also checked to lie on the
//! canvas, so a text entirely past the border cannot hide there: a text that starts on the canvas and leaves
//! it has ink right past the edge. A viewer with a wider sans-serif than this machine's could still differ;
//! the charts lay text out with a generous estimate (0.62 em a character) to leave room for that.
mod png;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// How far past the canvas the text-only document reaches, in pixels.
const MARGIN: usize = 64;

/// Where the PNGs go: `target/charts/`, beside the test binary's `target/<profile>/deps/`.
fn out_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let target = exe.ancestors().nth(3).expect("target/<profile>/deps/<test binary>");
    let dir = target.join("charts");
    std::fs::create_dir_all(&dir).expect("target/charts");
    dir
}

/// Every chart the demo, the study examples and the benchmark report produce: (file stem, SVG).
fn every_chart() -> Vec<(String, String)> {
    let mut charts = Vec::new();
    let acts: Vec<crate::demo::timeline::Act> =
        serde_json::from_str(include_str!("../../fixtures/demo-timeline.json"))
            .expect("the recorded demo run");
    charts.push((
        "demo-timeline".to_owned(),
        crate::demo::timeline::timeline_chart(&acts).expect("demo chart"),
    ));
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/study");
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(&examples)
        .expect("examples/study")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    scenarios.sort();
    assert!(!scenarios.is_empty(), "no scenario in {}", examples.display());
    for path in scenarios {
        let sc = tierlb::study::load(&path).expect("an example scenario");
        let svg = tierlb::chart::study_chart(&tierlb::study::run(&sc)).expect("study chart");
        let stem = path.file_stem().expect("a file name").to_string_lossy();
        charts.push((format!("study-{stem}"), svg));
    }
    for (name, svg) in crate::bench::charts(&crate::bench::fixture::report()).expect("bench charts") {
        charts.push((format!("bench-{}", name.trim_end_matches(".svg")), svg));
    }
    charts
}

/// Run rsvg-convert on `svg` (written to `dir/stem.svg`), writing `dir/stem.png`; its PNG bytes.
fn rsvg(dir: &Path, stem: &str, svg: &str) -> Result<Vec<u8>, String> {
    let (input, output) = (dir.join(format!("{stem}.svg")), dir.join(format!("{stem}.png")));
    std::fs::write(&input, svg).map_err(|e| format!("{}: {e}", input.display()))?;
    let out = match Command::new("rsvg-convert")
        .arg("--format=png")
        .arg("--output")
        .arg(&output)
        .arg(&input)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "rsvg-convert is not installed: run `cargo xtask setup` (it installs Debian's librsvg2-bin), then \
             this test again"
        ),
        Err(e) => return Err(format!("rsvg-convert: {e}")),
    };
    if !out.status.success() {
        return Err(format!("rsvg-convert {}: {}", input.display(), String::from_utf8_lossy(&out.stderr)));
    }
    std::fs::read(&output).map_err(|e| format!("{}: {e}", output.display()))
}

/// The root element's `width` and `height` attributes.
fn canvas(svg: &str) -> (usize, usize) {
    let root = &svg[..svg.find('>').expect("a root element")];
    let attr = |name: &str| -> usize {
        let start = root.find(&format!(" {name}=\"")).unwrap_or_else(|| panic!("no {name} in {root}"))
            + name.len()
            + 3;
        root[start..]
            .split('"')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {root}"))
    };
    (attr("width"), attr("height"))
}

/// Every `<text>…</text>` element of `svg`, whole.
fn text_elements(svg: &str) -> Vec<&str> {
    svg.match_indices("<text ")
        .map(|(at, _)| {
            let end = svg[at..].find("</text>").expect("a closed text element") + "</text>".len();
            &svg[at..at + end]
        })
        .collect()
}

/// The anchor (x, y attributes) of a text element.
fn anchor(element: &str) -> (f64, f64) {
    let attr = |name: &str| -> f64 {
        let start = element.find(&format!(" {name}=\"")).expect("x and y") + name.len() + 3;
        element[start..].split('"').next().and_then(|v| v.parse().ok()).expect("a number")
    };
    (attr("x"), attr("y"))
}

/// `texts` alone on a canvas of `size` widened by [`MARGIN`] on every side.
fn text_only(size: (usize, usize), texts: &[&str]) -> String {
    let (w, h) = (size.0 + 2 * MARGIN, size.1 + 2 * MARGIN);
    format!(
        "<svg width=\"{w}\" height=\"{h}\" viewBox=\"-{MARGIN} -{MARGIN} {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">\n{}\n</svg>\n",
        texts.join("\n")
    )
}

/// In a text-only rendering of a `size` canvas: the pixels with ink more than a pixel past the canvas, and
/// those on it.
fn ink(img: &png::Image, size: (usize, usize)) -> (usize, usize) {
    let (mut outside, mut inside) = (0, 0);
    for y in 0..img.height {
        for x in 0..img.width {
            if img.alpha(x, y) == 0 {
                continue;
            }
            let off = x + 1 < MARGIN || y + 1 < MARGIN || x > MARGIN + size.0 || y > MARGIN + size.1;
            if off {
                outside += 1;
            } else {
                inside += 1;
            }
        }
    }
    (outside, inside)
}

/// What is wrong with one chart's text, if anything: texts anchored off the canvas, and texts whose glyphs
/// reach past it (each found by rendering it alone, only when the whole chart's text has ink outside).
fn check_text(dir: &Path, stem: &str, svg: &str) -> Result<(), String> {
    let size = canvas(svg);
    let texts = text_elements(svg);
    let content =
        |t: &str| t.split_once('>').map_or("", |(_, c)| c).trim_end_matches("</text>").trim().to_owned();
    let mut wrong: Vec<String> = texts
        .iter()
        .filter(|t| {
            let (x, y) = anchor(t);
            !(0.0..=size.0 as f64).contains(&x) || !(0.0..=size.1 as f64).contains(&y)
        })
        .map(|t| format!("anchored off the canvas: {:?}", content(t)))
        .collect();
    let all = png::decode(&rsvg(dir, &format!("{stem}.text"), &text_only(size, &texts))?)?;
    let (outside, inside) = ink(&all, size);
    if inside == 0 {
        return Err(format!("{stem}: its {} texts rendered no ink at all (no font?)", texts.len()));
    }
    if outside > 0 {
        for (i, t) in texts.iter().enumerate() {
            let one = png::decode(&rsvg(dir, &format!("{stem}.text-{i}"), &text_only(size, &[t]))?)?;
            if ink(&one, size).0 > 0 {
                wrong.push(format!("reaches past the canvas: {:?}", content(t)));
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{stem} ({}x{}): {}", size.0, size.1, wrong.join("; ")))
    }
}

#[test]
fn every_chart_renders_to_png_with_its_text_on_the_canvas() {
    let dir = out_dir();
    let mut failures = Vec::new();
    let charts = every_chart();
    // The demo's, seven study examples, the bench's two modes.
    assert!(charts.len() >= 10, "{} charts", charts.len());
    for (stem, svg) in &charts {
        let rendered = rsvg(&dir, stem, svg).and_then(|p| png::decode(&p));
        match rendered {
            Ok(img) if (img.width, img.height) == canvas(svg) => {}
            Ok(img) => {
                failures.push(format!(
                    "{stem}: rendered {}x{}, not {:?}",
                    img.width,
                    img.height,
                    canvas(svg)
                ));
            }
            Err(e) => failures.push(format!("{stem}: {e}")),
        }
        if let Err(e) = check_text(&dir, stem, svg) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "charts in {}:\n{}", dir.display(), failures.join("\n"));
}

#[test]
fn text_past_the_canvas_is_found_and_named() {
    // A chart-like document with one text on the canvas and one running off its right edge.
    let svg = "<svg width=\"200\" height=\"50\" viewBox=\"0 0 200 50\" xmlns=\"http://www.w3.org/2000/svg\">\n\
               <text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"12\">\non the canvas\n</text>\n\
               <text x=\"150\" y=\"40\" font-family=\"sans-serif\" font-size=\"12\">\nrunning off the edge\n</text>\n\
               </svg>\n";
    let err = check_text(&out_dir(), "selftest", svg).unwrap_err();
    assert!(err.contains("reaches past the canvas: \"running off the edge\""), "{err}");
    assert!(!err.contains("on the canvas\""), "{err}");
}
