//! Small SVG charts (grouped bars, time lines) written by hand: the charts are simple and a plotting
//! library would add much more code than it saves.
use std::fmt::Write as _;

use crate::study::StudyResult;

const COLORS: [&str; 8] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The opening tag, title, horizontal grid (0..=1 in quarters, labelled by `tick`) and the y-axis label of a
/// chart whose plot area is `(left, top, w, h)`.
fn frame(
    title: &str,
    size: (f64, f64),
    area: (f64, f64, f64, f64),
    y_label: &str,
    tick: impl Fn(f64) -> String,
) -> String {
    let ((width, height), (left, top, w, h)) = (size, area);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<text x="{left}" y="20" font-size="14">{}</text>"#, esc(title));
    for i in 0..=4 {
        let v = f64::from(i) / 4.0;
        let y = top + h - h * v;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.0}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + w,
            left - 4.0,
            y + 4.0,
            tick(v)
        );
    }
    let mid = top + h / 2.0;
    let _ = writeln!(
        s,
        r#"<text x="14" y="{mid:.0}" transform="rotate(-90 14 {mid:.0})">{}</text>"#,
        esc(y_label)
    );
    s
}

fn legend_entry(s: &mut String, x: f64, y: f64, color: &str, name: &str) {
    let _ = writeln!(
        s,
        r#"<rect x="{x:.0}" y="{y:.0}" width="10" height="10" fill="{color}"/><text x="{:.0}" y="{:.0}">{}</text>"#,
        x + 15.0,
        y + 9.0,
        esc(name)
    );
}

/// One group of bars per (phase, model); one bar per endpoint's share, plus failed+hang in grey.
pub fn study_chart(r: &StudyResult) -> String {
    let groups: Vec<(String, Vec<(String, f64)>)> = r
        .phases
        .iter()
        .flat_map(|p| {
            p.models.iter().map(move |m| {
                let model = serde_json::to_value(m.model)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let mut bars: Vec<(String, f64)> = m.shares.iter().map(|(k, v)| (k.clone(), *v)).collect();
                bars.push(("failed/hang".into(), m.failed + m.hang));
                (format!("{} / {model}", p.phase), bars)
            })
        })
        .collect();
    bar_chart(&format!("tierlb study: {}", r.scenario), &groups, "share of requests")
}

/// Grouped bar chart with values in 0..=1.
pub fn bar_chart(title: &str, groups: &[(String, Vec<(String, f64)>)], y_label: &str) -> String {
    let bars_per = groups.iter().map(|g| g.1.len()).max().unwrap_or(1);
    let (bar_w, gap, left, top, h) = (14.0, 18.0, 60.0, 40.0, 260.0);
    let group_w = bars_per as f64 * bar_w + gap;
    let w = group_w * groups.len() as f64;
    let mut s = frame(title, (left + w + 180.0, top + h + 150.0), (left, top, w, h), y_label, |v| {
        format!("{:.0}%", v * 100.0)
    });
    let mut legend: Vec<String> = Vec::new();
    let color_of = |legend: &[String], name: &str| {
        if name == "failed/hang" {
            "#999"
        } else {
            COLORS[legend.iter().position(|l| l == name).unwrap_or(0) % COLORS.len()]
        }
    };
    for (gi, (label, bars)) in groups.iter().enumerate() {
        let x0 = left + gap / 2.0 + group_w * gi as f64;
        for (bi, (name, v)) in bars.iter().enumerate() {
            if !legend.contains(name) {
                legend.push(name.clone());
            }
            let bh = h * v.clamp(0.0, 1.0);
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{bar_w}" height="{bh:.1}" fill="{}"><title>{}: {:.1}%</title></rect>"#,
                x0 + bar_w * bi as f64,
                top + h - bh,
                color_of(&legend, name),
                esc(name),
                v * 100.0
            );
        }
        let cx = x0 + bars.len() as f64 * bar_w / 2.0;
        let ly = top + h + 14.0;
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{ly:.1}" transform="rotate(40 {cx:.1} {ly:.1})">{}</text>"#,
            esc(label)
        );
    }
    for (i, name) in legend.iter().enumerate() {
        legend_entry(&mut s, left + w + 10.0, top + 14.0 * i as f64, color_of(&legend, name), name);
    }
    s.push_str("</svg>\n");
    s
}

/// Lines over time; y in 0..=1.
pub fn line_chart(title: &str, series: &[(String, Vec<(f64, f64)>)], x_label: &str, y_label: &str) -> String {
    let (left, top, w, h) = (60.0, 40.0, 760.0, 300.0);
    let x_max = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).fold(1.0, f64::max);
    let mut s =
        frame(title, (left + w + 260.0, top + h + 60.0), (left, top, w, h), y_label, |v| format!("{v:.2}"));
    let _ =
        writeln!(s, r#"<text x="{:.0}" y="{:.0}">{}</text>"#, left + w / 2.0, top + h + 35.0, esc(x_label));
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if name.contains("off-node") { r#" stroke-dasharray="4 3""# } else { "" };
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", left + w * x / x_max, top + h - h * y.clamp(0.0, 1.0)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{}"/>"#,
            path.join(" ")
        );
        legend_entry(&mut s, left + w + 15.0, top + 14.0 * i as f64, color, name);
    }
    s.push_str("</svg>\n");
    s
}
