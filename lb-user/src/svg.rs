//! Small SVG charts (grouped bars, time lines) written by hand: the charts are simple and a plotting
//! library would add much more code than it saves.
use std::fmt::Write as _;

use crate::study::StudyResult;

const COLORS: [&str; 8] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
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

/// Grouped horizontal-label bar chart with values in 0..=1.
pub fn bar_chart(title: &str, groups: &[(String, Vec<(String, f64)>)], y_label: &str) -> String {
    let bars_per = groups.iter().map(|g| g.1.len()).max().unwrap_or(1);
    let (bar_w, gap, left, top, h) = (14.0, 18.0, 60.0, 40.0, 260.0);
    let group_w = bars_per as f64 * bar_w + gap;
    let width = left + group_w * groups.len() as f64 + 180.0;
    let height = top + h + 150.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<text x="{left}" y="20" font-size="14">{}</text>"#, esc(title));
    for i in 0..=4 {
        let y = top + h - h * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.0}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{}%</text>"##,
            width - 180.0,
            left - 4.0,
            y + 4.0,
            i * 25
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.0}" transform="rotate(-90 14 {:.0})">{}</text>"#,
        top + h / 2.0,
        top + h / 2.0,
        esc(y_label)
    );
    let mut legend: Vec<String> = Vec::new();
    for (gi, (label, bars)) in groups.iter().enumerate() {
        let x0 = left + gap / 2.0 + group_w * gi as f64;
        for (bi, (name, v)) in bars.iter().enumerate() {
            if !legend.contains(name) {
                legend.push(name.clone());
            }
            let color = if name == "failed/hang" {
                "#999"
            } else {
                COLORS[legend.iter().position(|l| l == name).unwrap_or(0) % COLORS.len()]
            };
            let bh = h * v.clamp(0.0, 1.0);
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{bar_w}" height="{bh:.1}" fill="{color}"><title>{}: {:.1}%</title></rect>"#,
                x0 + bar_w * bi as f64,
                top + h - bh,
                esc(name),
                v * 100.0
            );
        }
        let cx = x0 + bars.len() as f64 * bar_w / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" transform="rotate(40 {cx:.1} {:.1})">{}</text>"#,
            top + h + 14.0,
            top + h + 14.0,
            esc(label)
        );
    }
    for (i, name) in legend.iter().enumerate() {
        let y = top + 14.0 * i as f64;
        let color = if name == "failed/hang" { "#999" } else { COLORS[i % COLORS.len()] };
        let _ = writeln!(
            s,
            r#"<rect x="{:.0}" y="{y:.0}" width="10" height="10" fill="{color}"/><text x="{:.0}" y="{:.0}">{}</text>"#,
            width - 170.0,
            width - 155.0,
            y + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Lines over time; y in 0..=1.
pub fn line_chart(title: &str, series: &[(String, Vec<(f64, f64)>)], x_label: &str, y_label: &str) -> String {
    let (left, top, w, h) = (60.0, 40.0, 760.0, 300.0);
    let x_max = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).fold(1.0, f64::max);
    let width = left + w + 260.0;
    let height = top + h + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<text x="{left}" y="20" font-size="14">{}</text>"#, esc(title));
    for i in 0..=4 {
        let y = top + h - h * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.0}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{:.2}</text>"##,
            left + w,
            left - 4.0,
            y + 4.0,
            f64::from(i) / 4.0
        );
    }
    let _ =
        writeln!(s, r#"<text x="{:.0}" y="{:.0}">{}</text>"#, left + w / 2.0, top + h + 35.0, esc(x_label));
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.0}" transform="rotate(-90 14 {:.0})">{}</text>"#,
        top + h / 2.0,
        top + h / 2.0,
        esc(y_label)
    );
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
        let ly = top + 14.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.0}" y="{ly:.0}" width="10" height="10" fill="{color}"/><text x="{:.0}" y="{:.0}">{}</text>"#,
            left + w + 15.0,
            left + w + 30.0,
            ly + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}
